//! What the console's tests share: 10,000 letters of known shape, a console over a sink and a
//! store served on a loopback port, a client that names its actor, and `exercise`, which runs
//! every JSON route against one backend and checks what it answers.
#![allow(dead_code)] // each test file uses a part

#[path = "../http_support/mod.rs"]
mod http_support;

pub use http_support::{Client, Reply, serve};

use bytes::Bytes;
use http_body_util::Full;
use jobguard::console::Console;
use jobguard::dead_letter::Browse;
use jobguard::{
    CircuitBreaker, ClaimOptions, Claimed, DeadLetter, Event, GiveUp, Runtime, Store, StoreKey,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How many letters the tests fill a sink with.
pub const LETTERS: usize = 10_000;

/// The scope of the keys the tests look up.
pub const SCOPE: &str = "tests.console";

/// Letter `i` of the [`LETTERS`]: every fourth is `mail.send` ("smtp refused"), the rest
/// `payments.charge` ("gateway timeout #i"); every tenth `crashed`, the rest `exhausted`; key
/// `k-i`; its payload `[i]`.
pub fn letter(i: usize) -> DeadLetter {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i as u64);
    let (job, error) = if i.is_multiple_of(4) {
        ("mail.send", "smtp refused".to_owned())
    } else {
        ("payments.charge", format!("gateway Timeout #{i}"))
    };
    let reason = if i.is_multiple_of(10) {
        GiveUp::Crashed
    } else {
        GiveUp::Exhausted
    };
    DeadLetter::new(job, Some(format!("k-{i}")), reason, 5, error, t, t)
        .with_payload(Some(json!([i])))
}

/// The `ConsoleAction` events a runtime's observer heard: action, targets, actor, outcome.
pub type Heard = Arc<Mutex<Vec<(String, Vec<String>, Option<String>, String)>>>;

/// A runtime whose observer keeps every `ConsoleAction`.
pub fn listening() -> (Runtime, Heard) {
    let heard: Heard = Arc::default();
    let keep = heard.clone();
    let runtime = Runtime::builder()
        .observer(move |event: &Event<'_>| {
            if let Event::ConsoleAction {
                action,
                targets,
                actor,
                outcome,
            } = event
            {
                keep.lock().unwrap().push((
                    action.to_string(),
                    targets.to_vec(),
                    actor.map(str::to_owned),
                    outcome.to_string(),
                ));
            }
        })
        .build();
    (runtime, heard)
}

/// The breaker the tests show and reset.
pub static GATEWAY: CircuitBreaker =
    CircuitBreaker::new(3, Duration::from_secs(600)).named("gateway");

/// Who the test's requests say they are.
pub const ACTOR: &str = "ada@example.com";

/// `method path` with `x-jobguard-actor: ada@example.com` and `body`.
pub async fn send(client: &Client, method: &str, path: &str, body: &str) -> Reply {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("x-jobguard-actor", ACTOR)
        .header("content-type", "application/json")
        .body(Full::from(Bytes::from(body.to_owned())))
        .unwrap();
    client.send_request(request).await
}

/// `GET path`, which must answer `200` with JSON.
pub async fn get_json(client: &Client, path: &str) -> Value {
    let reply = send(client, "GET", path, "").await;
    assert_eq!(reply.status, 200, "GET {path}: {reply:?}");
    reply.json()
}

/// Every letter a filter shows, page after page of `limit`: the ids (checked newest first, no
/// repeats) and the letters.
pub async fn walk(client: &Client, filter: &str, limit: usize) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("/jobguard/api/dead-letters?limit={limit}");
        if !filter.is_empty() {
            path = format!("{path}&{filter}");
        }
        if let Some(c) = &cursor {
            path = format!("{path}&cursor={c}");
        }
        let page = get_json(client, &path).await;
        let letters = page["letters"].as_array().expect("letters").clone();
        assert!(letters.len() <= limit, "{path}: {} letters", letters.len());
        pages += 1;
        all.extend(letters);
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(all.len(), pages * limit, "a page before the last is full");
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    let ids: Vec<&str> = all.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "no letter twice");
    all
}

/// The index `i` of a letter made by [`letter`], from its payload.
pub fn index(letter: &Value) -> usize {
    letter["payload"][0].as_u64().expect("a payload") as usize
}

/// How many of the [`LETTERS`] match `keep`.
pub fn expected(keep: impl Fn(&DeadLetter) -> bool) -> usize {
    (0..LETTERS).filter(|i| keep(&letter(*i))).count()
}

/// Polls `store` until `k` is poisoned after one abandoned claim (lease 1 ms, crash limit 1),
/// within 10 s.
pub async fn poison(store: &dyn Store, k: StoreKey<'_>) {
    let options = ClaimOptions::new(Duration::from_millis(1)).crashes(1);
    let first = store.claim(k, "tok-1", options).await.unwrap();
    assert!(matches!(first, Claimed::Acquired { .. }), "{first:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 2;
    loop {
        let token = format!("tok-{n}");
        match store.claim(k, &token, options).await.unwrap() {
            Claimed::Poisoned { .. } => return,
            Claimed::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
        assert!(Instant::now() < deadline, "the key was never poisoned");
        n += 1;
        tokio::task::yield_now().await;
    }
}

/// The console the tests serve: `letters` and `store`, the [`GATEWAY`] breaker, and a
/// redrive handler for `payments.charge` that fails on key `k-1` ("card declined") and
/// counts the letters it ran.
pub fn console<L, S>(letters: L, store: S, runtime: Runtime) -> (Console, Arc<Mutex<Vec<usize>>>)
where
    L: Browse + 'static,
    S: Store + 'static,
{
    let ran: Arc<Mutex<Vec<usize>>> = Arc::default();
    let seen = ran.clone();
    let console = Console::new()
        .dead_letters(letters)
        .store(store)
        .breaker("gateway", &GATEWAY)
        .runtime(runtime)
        .redrive("payments.charge", move |letter: DeadLetter| {
            let seen = seen.clone();
            async move {
                if letter.key.as_deref() == Some("k-1") {
                    return Err("card declined".to_owned());
                }
                let (i,): (usize,) = letter.payload_as().unwrap().unwrap();
                seen.lock().unwrap().push(i);
                Ok(())
            }
        });
    (console, ran)
}

/// Serves `console` at `/jobguard` on a loopback port.
pub async fn serve_console(console: Console) -> Client {
    let app = axum::Router::new().nest("/jobguard", console.router());
    Client::new(serve(app).await)
}

/// Every JSON route against one backend. `letters` holds the [`LETTERS`] (letter `i` added
/// `i`-th) and, after them, one corrupt entry when `corrupt` (a sink that can hold one);
/// `store` is empty; `read_only` is the same console again, to be made read-only for the
/// `403`s.
pub async fn exercise<L, S>(letters: L, store: S, read_only: Console, corrupt: bool)
where
    L: Browse + Clone + 'static,
    S: Store + Clone + 'static,
{
    let (runtime, heard) = listening();
    let (console, ran) = console(letters.clone(), store.clone(), runtime);
    let client = serve_console(console).await;

    // Every letter, newest first, in pages of 500: the corrupt entry first, in its place.
    let all = walk(&client, "", 500).await;
    let skip = usize::from(corrupt);
    assert_eq!(all.len(), LETTERS + skip);
    if corrupt {
        assert!(all[0]["corrupt"].as_str().is_some(), "{}", all[0]);
    }
    let order: Vec<usize> = all[skip..].iter().map(index).collect();
    assert_eq!(order, (0..LETTERS).rev().collect::<Vec<_>>());
    let first = &all[LETTERS + skip - 1];
    for field in [
        "id",
        "job",
        "key",
        "reason",
        "attempts",
        "error",
        "first_attempt",
        "last_attempt",
        "payload",
    ] {
        assert!(!first[field].is_null(), "{field} in {first}");
    }
    assert_eq!(first["first_attempt"], "2027-01-15T08:00:00.000Z");

    // Filters, each over every page.
    let mail = walk(&client, "job=mail.send", 100).await;
    assert_eq!(mail.len(), expected(|l| l.job == "mail.send"));
    assert!(mail.iter().all(|l| l["job"] == "mail.send"));
    let crashed = walk(&client, "job=payments.charge&reason=crashed", 77).await;
    assert_eq!(
        crashed.len(),
        expected(|l| l.job == "payments.charge" && l.reason == GiveUp::Crashed)
    );
    let one = walk(&client, "key=k-42", 50).await;
    assert_eq!(one.iter().map(index).collect::<Vec<_>>(), [42]);
    let text = walk(&client, "q=TIMEOUT%20%2377", 50).await;
    let want = expected(|l| l.error.to_lowercase().contains("timeout #77"));
    assert!(want > 50, "{want}");
    assert_eq!(text.len(), want);
    assert!(walk(&client, "q=nothing-like-this", 50).await.is_empty());

    // One letter.
    let id_of = |i: usize| {
        all[LETTERS + skip - 1 - i]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let detail = get_json(&client, &format!("/jobguard/api/dead-letters/{}", id_of(7))).await;
    assert_eq!(detail["key"], "k-7");
    assert_eq!(detail["error"], "gateway Timeout #7");
    assert_eq!(detail["attempts"], 5);
    if corrupt {
        let path = format!(
            "/jobguard/api/dead-letters/{}",
            all[0]["id"].as_str().unwrap()
        );
        let entry = get_json(&client, &path).await;
        assert!(entry["corrupt"].is_string(), "{entry}");
    }

    // Bad input: 404 for an id the sink does not hold, 400 for a malformed query.
    for path in [
        "/jobguard/api/dead-letters/999999999",
        "/jobguard/api/dead-letters/no-such-id",
    ] {
        send(&client, "GET", path, "").await.problem(404);
    }
    for query in [
        "cursor=not-a-cursor",
        "reason=tired",
        "limit=0",
        "limit=501",
        "limit=x",
        "colour=red",
        "job=a&job=b",
    ] {
        send(
            &client,
            "GET",
            &format!("/jobguard/api/dead-letters?{query}"),
            "",
        )
        .await
        .problem(400);
    }

    // Redrive one: it runs, and the letter goes.
    let path = format!("/jobguard/api/dead-letters/{}/redrive", id_of(5));
    let reply = send(&client, "POST", &path, "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json(), json!({"redriven": true}));
    assert_eq!(*ran.lock().unwrap(), [5]);
    send(
        &client,
        "GET",
        &format!("/jobguard/api/dead-letters/{}", id_of(5)),
        "",
    )
    .await
    .problem(404);
    send(&client, "POST", &path, "").await.problem(404);
    // A redrive whose job fails again keeps the letter and shows the job's error.
    let path = format!("/jobguard/api/dead-letters/{}/redrive", id_of(1));
    let failed = send(&client, "POST", &path, "").await;
    failed.problem(502);
    assert_eq!(failed.json()["error"], "card declined");
    get_json(&client, &format!("/jobguard/api/dead-letters/{}", id_of(1))).await;
    // A job without a handler: 422, the letter kept.
    let path = format!("/jobguard/api/dead-letters/{}/redrive", id_of(4));
    send(&client, "POST", &path, "").await.problem(422);

    // Delete one.
    let path = format!("/jobguard/api/dead-letters/{}", id_of(9));
    let reply = send(&client, "DELETE", &path, "").await;
    assert_eq!(reply.json(), json!({"deleted": true}));
    send(&client, "DELETE", &path, "").await.problem(404);

    // Bulk delete: a stale count is 409 with the count now, and nothing goes.
    let filter = "job=mail.send&reason=crashed";
    let matching = expected(|l| l.job == "mail.send" && l.reason == GiveUp::Crashed);
    let path = format!("/jobguard/api/dead-letters/delete?{filter}");
    let stale = send(
        &client,
        "POST",
        &path,
        &format!(r#"{{"expect": {}}}"#, matching - 1),
    )
    .await;
    stale.problem(409);
    assert_eq!(stale.json()["count"], matching);
    assert_eq!(walk(&client, filter, 500).await.len(), matching);
    send(&client, "POST", &path, "{}").await.problem(400);
    send(&client, "POST", &path, "not json").await.problem(400);
    let reply = send(
        &client,
        "POST",
        &path,
        &format!(r#"{{"expect": {matching}}}"#),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json()["deleted"], matching);
    assert!(walk(&client, filter, 500).await.is_empty());
    assert_eq!(
        walk(&client, "job=mail.send", 500).await.len(),
        expected(|l| l.job == "mail.send") - matching
    );

    // Bulk redrive of every `timeout #99`: k-1 is not among them, so all run and go.
    let filter = "q=timeout%20%2399";
    let matching = walk(&client, filter, 500).await.len();
    assert!(matching > 50, "{matching}");
    let reply = send(
        &client,
        "POST",
        &format!("/jobguard/api/dead-letters/redrive?{filter}"),
        &format!(r#"{{"expect": {matching}}}"#),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json()["redriven"], matching, "{:?}", reply.json());
    assert!(walk(&client, filter, 500).await.is_empty());
    assert_eq!(ran.lock().unwrap().len(), 1 + matching);

    // Keys: free, claimed with its lease's end, completed with its result, poisoned with its
    // crashes; forgive and forget.
    let k = |key| StoreKey { scope: SCOPE, key };
    let key_json =
        async |key: &str| get_json(&client, &format!("/jobguard/api/keys/{SCOPE}/{key}")).await;
    assert_eq!(key_json("never").await["state"], "free");
    let lease = ClaimOptions::new(Duration::from_secs(60));
    assert!(matches!(
        store.claim(k("held"), "t", lease).await.unwrap(),
        Claimed::Acquired { .. }
    ));
    let held = key_json("held").await;
    assert_eq!(held["state"], "claimed");
    assert_eq!(held["generation"], 1);
    assert!(
        held["lease_ends"].as_str().unwrap().ends_with('Z'),
        "{held}"
    );
    store.claim(k("done"), "t", lease).await.unwrap();
    store
        .complete(
            k("done"),
            "t",
            br#"{"ok":{"charged":100}}"#,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let done = key_json("done").await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["result"], json!({"ok": {"charged": 100}}));
    poison(&store, k("bad")).await;
    let bad = key_json("bad").await;
    assert_eq!(bad["state"], "poisoned", "{bad}");
    assert_eq!(bad["crashes"], 1);
    let reply = send(
        &client,
        "POST",
        &format!("/jobguard/api/keys/{SCOPE}/bad/forgive"),
        "",
    )
    .await;
    assert_eq!(reply.json(), json!({"forgiven": true}));
    assert_eq!(key_json("bad").await["state"], "free");
    let reply = send(
        &client,
        "POST",
        &format!("/jobguard/api/keys/{SCOPE}/done/forget"),
        "",
    )
    .await;
    assert_eq!(reply.json(), json!({"forgotten": true}));
    assert_eq!(key_json("done").await["state"], "free");
    assert!(matches!(
        store.claim(k("done"), "t2", lease).await.unwrap(),
        Claimed::Acquired { .. }
    ));

    // Breakers.
    GATEWAY.trip();
    let breakers = get_json(&client, "/jobguard/api/breakers").await;
    assert_eq!(breakers[0]["name"], "gateway");
    assert_eq!(breakers[0]["state"], "open");
    let reply = send(&client, "POST", "/jobguard/api/breakers/gateway/reset", "").await;
    assert_eq!(reply.json(), json!({"reset": true}));
    assert_eq!(
        get_json(&client, "/jobguard/api/breakers").await[0]["state"],
        "closed"
    );
    send(&client, "POST", "/jobguard/api/breakers/nope/reset", "")
        .await
        .problem(404);

    // The audit trail: every action, by whom, on what.
    let heard = heard.lock().unwrap().clone();
    assert!(
        heard
            .iter()
            .all(|(_, _, actor, _)| actor.as_deref() == Some(ACTOR)),
        "{heard:?}"
    );
    let of = |action: &str| {
        heard
            .iter()
            .filter(|(a, ..)| a == action)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("redrive")[0].1, [id_of(5)]);
    assert_eq!(of("redrive")[0].3, "ok");
    assert!(of("redrive")[1].3.contains("card declined"), "{heard:?}");
    let deleted: usize = of("delete").iter().map(|(_, ids, ..)| ids.len()).sum();
    assert_eq!(
        deleted,
        1 + expected(|l| l.job == "mail.send" && l.reason == GiveUp::Crashed)
    );
    assert_eq!(of("forgive")[0].1, [format!("{SCOPE}/bad")]);
    assert_eq!(of("forget")[0].1, [format!("{SCOPE}/done")]);
    assert_eq!(of("reset")[0].1, ["gateway"]);

    // Read-only: every action is 403, and nothing changes; reading works.
    let client = serve_console(read_only.read_only(true)).await;
    let id = id_of(3);
    for (method, path, body) in [
        (
            "POST",
            format!("/jobguard/api/dead-letters/{id}/redrive"),
            "",
        ),
        ("DELETE", format!("/jobguard/api/dead-letters/{id}"), ""),
        (
            "POST",
            "/jobguard/api/dead-letters/delete".to_owned(),
            r#"{"expect": 1}"#,
        ),
        (
            "POST",
            "/jobguard/api/dead-letters/redrive".to_owned(),
            r#"{"expect": 1}"#,
        ),
        (
            "POST",
            format!("/jobguard/api/keys/{SCOPE}/held/forget"),
            "",
        ),
        (
            "POST",
            format!("/jobguard/api/keys/{SCOPE}/held/forgive"),
            "",
        ),
        (
            "POST",
            "/jobguard/api/breakers/gateway/reset".to_owned(),
            "",
        ),
    ] {
        send(&client, method, &path, body).await.problem(403);
    }
    get_json(&client, &format!("/jobguard/api/dead-letters/{id}")).await;
    assert_eq!(
        get_json(&client, &format!("/jobguard/api/keys/{SCOPE}/held")).await["state"],
        "claimed"
    );
}
