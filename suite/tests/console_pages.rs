//! The console's HTML pages over plain HTTP (the browser test drives them in Chromium): each
//! page renders, a letter's text is escaped, a bad filter or an unknown letter is a page that
//! says so with its status, a stale count on the confirmation page does nothing, a read-only
//! console shows no action and refuses one, and a form a browser marks as sent from another
//! site is refused.

mod console_support;

use console_support::{Client, console, letter, listening, send, serve};
use jobguard::{DeadLetter, DeadLetterSink, GiveUp, MemoryDeadLetters, MemoryStore};
use std::time::SystemTime;

async fn page(client: &Client, path: &str, status: u16) -> String {
    let reply = send(client, "GET", path, "").await;
    assert_eq!(reply.status, status, "GET {path}: {reply:?}");
    assert!(
        reply.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{reply:?}"
    );
    String::from_utf8(reply.body.to_vec()).unwrap()
}

async fn form(
    client: &Client,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> console_support::Reply {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    client
        .send_request(
            request
                .body(http_body_util::Full::from(bytes::Bytes::from(
                    body.to_owned(),
                )))
                .unwrap(),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_render_escape_refuse_and_confirm() {
    let letters = MemoryDeadLetters::new();
    for i in 0..12 {
        letters.send(letter(i)).await.unwrap();
    }
    let now = SystemTime::now();
    let hostile = DeadLetter::new(
        "x",
        None,
        GiveUp::Permanent,
        1,
        "<script>alert(1)</script>",
        now,
        now,
    );
    letters.send(hostile).await.unwrap();
    let store = MemoryStore::new();
    let (runtime, heard) = listening();
    let (built, _) = console(letters.clone(), store.clone(), runtime);
    let client =
        Client::new(serve(axum::Router::new().nest("/jobguard", built.clone().router())).await);

    // Every page renders; links carry the mount path.
    let home = send(&client, "GET", "/jobguard", "").await;
    assert_eq!(home.status, 303);
    assert_eq!(home.headers["location"], "/jobguard/dead-letters");
    let list = page(&client, "/jobguard/dead-letters", 200).await;
    assert!(list.contains(r#"<span id="count">13</span>"#), "{list}");
    assert!(list.contains(r#"href="/jobguard/dead-letters/13""#));
    assert!(!list.contains("<script>alert"), "the error is escaped");
    assert!(list.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let detail = page(&client, "/jobguard/dead-letters/13", 200).await;
    assert!(detail.contains(r#"id="redrive""#) && detail.contains(r#"id="delete""#));
    assert!(
        page(&client, "/jobguard/keys?scope=a&key=b", 200)
            .await
            .contains(r#"<dd id="state">free</dd>"#)
    );
    assert!(
        page(&client, "/jobguard/breakers", 200)
            .await
            .contains(r#"data-name="gateway""#)
    );

    // Bad input is a page with the status and what to do.
    assert!(
        page(&client, "/jobguard/dead-letters/404404", 404)
            .await
            .contains("There is no letter")
    );
    assert!(
        page(&client, "/jobguard/dead-letters?reason=tired", 400)
            .await
            .contains("is not a reason")
    );
    page(&client, "/jobguard/dead-letters?cursor=x", 400).await;
    page(&client, "/jobguard/keys?colour=red", 400).await;

    // A confirmation whose count went stale does nothing.
    let confirm = page(
        &client,
        "/jobguard/dead-letters/confirm?action=delete&job=mail.send",
        200,
    )
    .await;
    assert!(
        confirm.contains(r#"<strong id="confirm-count">3</strong>"#),
        "{confirm}"
    );
    letters.send(letter(12)).await.unwrap(); // one more mail.send
    let stale = form(
        &client,
        "/jobguard/dead-letters/bulk?action=delete&job=mail.send",
        "expect=3",
        &[],
    )
    .await;
    assert_eq!(stale.status, 409);
    assert!(String::from_utf8_lossy(&stale.body).contains("4 letters match this filter now"));
    assert_eq!(letters.len(), 14, "nothing deleted");
    let done = form(
        &client,
        "/jobguard/dead-letters/bulk?action=delete&job=mail.send",
        "expect=4",
        &[],
    )
    .await;
    assert_eq!(done.status, 303, "{done:?}");
    assert_eq!(
        done.headers["location"],
        "/jobguard/dead-letters?job=mail.send&notice=Deleted%204%20letter%28s%29."
    );
    assert_eq!(letters.len(), 10);

    // A form another site posts from the operator's browser is refused, and changes nothing.
    let cross = form(
        &client,
        "/jobguard/dead-letters/13/delete",
        "",
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(cross.status, 403);
    assert_eq!(letters.len(), 10);
    let same = form(
        &client,
        "/jobguard/dead-letters/13/delete",
        "",
        &[("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(same.status, 303);
    assert_eq!(letters.len(), 9);
    let actions: Vec<String> = heard
        .lock()
        .unwrap()
        .iter()
        .map(|(a, ..)| a.clone())
        .collect();
    assert_eq!(actions, ["delete", "delete"]);

    // Read-only: no action shown, every action refused.
    let client = Client::new(
        serve(axum::Router::new().nest("/jobguard", built.read_only(true).router())).await,
    );
    let list = page(&client, "/jobguard/dead-letters", 200).await;
    assert!(
        list.contains("read-only") && !list.contains("bulk-delete"),
        "{list}"
    );
    let detail = page(&client, "/jobguard/dead-letters/12", 200).await;
    assert!(!detail.contains(r#"id="redrive""#) && !detail.contains(r#"id="delete""#));
    for (path, body) in [
        ("/jobguard/dead-letters/12/delete", ""),
        ("/jobguard/dead-letters/12/redrive", ""),
        ("/jobguard/dead-letters/bulk?action=delete", "expect=9"),
        ("/jobguard/keys/forget", "scope=a&key=b"),
        ("/jobguard/breakers/gateway/reset", ""),
    ] {
        assert_eq!(form(&client, path, body, &[]).await.status, 403, "{path}");
    }
    page(&client, "/jobguard/dead-letters/confirm?action=delete", 403).await;
    assert_eq!(letters.len(), 9);

    // The actor an auth layer puts in the request's extensions wins over the header.
    let (runtime, heard) = listening();
    let (built, _) = console(letters.clone(), store.clone(), runtime);
    let authenticated =
        axum::Router::new()
            .nest("/jobguard", built.router())
            .layer(axum::middleware::from_fn(
                |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                    request
                        .extensions_mut()
                        .insert(jobguard::console::Actor("ops-bot".into()));
                    next.run(request).await
                },
            ));
    let client = Client::new(serve(authenticated).await);
    let reply = send(&client, "DELETE", "/jobguard/api/dead-letters/12", "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let heard = heard.lock().unwrap();
    assert_eq!(heard[0].2.as_deref(), Some("ops-bot"), "{heard:?}");
}
