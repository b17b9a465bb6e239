//! The HTML pages, rendered on the server with maud: forms that GET (filters, a key to look
//! up) or POST (actions), and no script.

use super::api::{pairs, path};
use super::{
    Bulk, Console, KeyAction, Problem, Query, actor_of, encode_component, result_json, rfc3339,
};
use crate::Error;
use crate::dead_letter::DeadLetter;
use crate::store::KeyState;
use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, OriginalUri, Path, Query as QueryPairs, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use std::sync::Arc;
use std::time::SystemTime;

type Shared = State<Arc<Console>>;
type Pairs = Result<QueryPairs<Vec<(String, String)>>, QueryRejection>;
type Fields = Result<Form<Vec<(String, String)>>, FormRejection>;
type Id = Result<Path<String>, PathRejection>;

pub(super) fn routes() -> Router<Arc<Console>> {
    Router::new()
        .route("/", get(home))
        .route("/dead-letters", get(letters))
        .route("/dead-letters/confirm", get(confirm))
        .route("/dead-letters/bulk", post(bulk))
        .route("/dead-letters/{id}", get(letter))
        .route("/dead-letters/{id}/redrive", post(redrive))
        .route("/dead-letters/{id}/delete", post(delete))
        .route("/keys", get(keys))
        .route("/keys/forgive", post(forgive))
        .route("/keys/forget", post(forget))
        .route("/breakers", get(breakers))
        .route("/breakers/{name}/reset", post(reset))
}

const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
nav{background:#22313f;padding:.6em 1.2em}nav a{color:#fff;margin-right:1.4em;text-decoration:none;font-weight:600}
nav .ro{color:#f5c518;float:right}main{padding:1em 1.2em}h1{font-size:1.3em;margin:.2em 0 .7em}
table{border-collapse:collapse;width:100%;background:#fff}th,td{border-bottom:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top}
th{background:#eef1f4}td.err{max-width:28em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
form.inline{display:inline}input,select{padding:.25em;margin-right:.4em}button{padding:.3em .8em;cursor:pointer}
button.danger{background:#b3261e;color:#fff;border:1px solid #8c1d18}button.act{background:#1f6feb;color:#fff;border:1px solid #1858bc}
.notice{background:#e6f4ea;border:1px solid #9bd3ae;padding:.5em .8em;margin-bottom:1em}
.problem{background:#fdecea;border:1px solid #f1aeb5;padding:.5em .8em;margin-bottom:1em}
.corrupt{color:#b3261e}dl{display:grid;grid-template-columns:max-content auto;gap:.3em 1em;background:#fff;padding:.8em}
dt{font-weight:600}dd{margin:0}pre{background:#f0f0f0;padding:.6em;overflow:auto;margin:0}.bar{margin:.8em 0}.muted{color:#666}
";

/// The path the console is nested under (`/jobguard`), from the request's original URI and the
/// path the console's router saw.
fn base(original: &OriginalUri, parts: &Parts) -> String {
    let full = original.0.path();
    let seen = parts.uri.path();
    match full.strip_suffix(seen) {
        Some(base) if seen != "/" => base.to_owned(),
        _ => full.trim_end_matches('/').to_owned(),
    }
}

/// A whole page.
fn layout(
    console: &Console,
    base: &str,
    title: &str,
    notice: Option<&str>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · jobguard" }
                style { (PreEscaped(CSS)) }
            }
            body {
                nav {
                    a href={ (base) "/dead-letters" } { "Dead letters" }
                    a href={ (base) "/keys" } { "Keys" }
                    a href={ (base) "/breakers" } { "Breakers" }
                    @if console.read_only { span.ro { "read-only" } }
                }
                main {
                    @if let Some(notice) = notice { p.notice #notice { (notice) } }
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A problem, as a page with its status.
fn problem_page(console: &Console, base: &str, problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = html! {
        div.problem #problem {
            strong { (problem.title) } br;
            (problem.detail)
            @for (name, value) in &problem.extra {
                br; (name) ": " code { (value) }
            }
        }
        p { a href={ (base) "/dead-letters" } { "Back to the dead letters" } }
    };
    (status, layout(console, base, problem.title, None, body)).into_response()
}

/// 303 to `to` (under the base).
fn see_other(to: String) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

fn notice_of(rest: &[(String, String)]) -> Option<String> {
    rest.iter()
        .find(|(n, _)| n == "notice")
        .map(|(_, v)| v.clone())
        .filter(|v| !v.is_empty())
}

fn with_notice(query: &str, notice: &str) -> String {
    let notice = format!("notice={}", encode_component(notice));
    if query.is_empty() {
        notice
    } else {
        format!("{query}&{notice}")
    }
}

fn time(t: SystemTime) -> String {
    rfc3339(t)
}

async fn home(original: OriginalUri, parts: Parts) -> Response {
    let base = base(&original, &parts);
    see_other(format!("{base}/dead-letters"))
}

async fn letters(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    query: Pairs,
) -> Response {
    let base = base(&original, &parts);
    let out: Result<Markup, Problem> = async {
        let (query, rest) = Query::parse(&pairs(query)?, &["notice"])?;
        let letters = console.letters()?;
        let page = console.page(&query).await?;
        let count = letters.count(&query.filter).await?;
        let filter = query.filter_string();
        let reason = query.filter.reason.map(|r| r.as_str());
        let body = html! {
            form #filter method="get" action={ (base) "/dead-letters" } {
                input name="job" placeholder="job" value=[query.filter.job.as_deref()];
                select name="reason" {
                    option value="" { "any reason" }
                    @for r in ["exhausted", "permanent", "budget", "circuit_open", "retry_budget", "crashed"] {
                        option value=(r) selected[reason == Some(r)] { (r) }
                    }
                }
                input name="key" placeholder="key" value=[query.filter.key.as_deref()];
                input name="q" placeholder="error contains" value=[query.filter.text.as_deref()];
                button #apply type="submit" { "Filter" }
                " "
                a href={ (base) "/dead-letters" } { "clear" }
            }
            p.bar {
                span #count { (count) } " letter(s) match"
                @if !query.filter.is_empty() { " this filter" }
                "."
                @if count > 0 && !console.read_only {
                    " "
                    a #bulk-redrive href={ (base) "/dead-letters/confirm?" (with_action(&filter, "redrive")) } { "Redrive all " (count) "…" }
                    " · "
                    a #bulk-delete href={ (base) "/dead-letters/confirm?" (with_action(&filter, "delete")) } { "Delete all " (count) "…" }
                }
            }
            table #letters {
                thead { tr { th { "id" } th { "job" } th { "key" } th { "reason" } th { "attempts" } th { "last attempt" } th { "error" } } }
                tbody {
                    @for (id, entry) in &page.entries {
                        tr data-id=(id) {
                            td { a href={ (base) "/dead-letters/" (encode_component(id)) } { (id) } }
                            @match entry {
                                Ok(l) => {
                                    td { (l.job) }
                                    td { (l.key.as_deref().unwrap_or("—")) }
                                    td { (l.reason.as_str()) }
                                    td { (l.attempts) }
                                    td { (time(l.last_attempt)) }
                                    td.err title=(l.error) { (l.error) }
                                }
                                Err(e) => {
                                    td.corrupt colspan="6" { "corrupt: " (e) }
                                }
                            }
                        }
                    }
                }
            }
            @if page.entries.is_empty() { p.muted { "No dead letters match." } }
            @if let Some(next) = &page.next {
                p.bar {
                    a #older href={ (base) "/dead-letters?" (join(&filter, &format!("cursor={}", encode_component(next)))) } { "Older →" }
                }
            }
        };
        Ok(layout(&console, &base, "Dead letters", notice_of(&rest).as_deref(), body))
    }
    .await;
    match out {
        Ok(page) => page.into_response(),
        Err(problem) => problem_page(&console, &base, &problem),
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a}&{b}"),
    }
}

fn with_action(filter: &str, action: &str) -> String {
    join(&format!("action={action}"), filter)
}

fn bulk_action(rest: &[(String, String)]) -> Result<Bulk, Problem> {
    match rest
        .iter()
        .find(|(n, _)| n == "action")
        .map(|(_, v)| v.as_str())
    {
        Some("redrive") => Ok(Bulk::Redrive),
        Some("delete") => Ok(Bulk::Delete),
        _ => Err(Problem::new(
            400,
            "bad-query",
            "Malformed query",
            "Say which bulk action to take: action=redrive or action=delete.",
        )),
    }
}

async fn confirm(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    query: Pairs,
) -> Response {
    let base = base(&original, &parts);
    let out: Result<Markup, Problem> = async {
        let (query, rest) = Query::parse(&pairs(query)?, &["action"])?;
        let action = bulk_action(&rest)?;
        console.writable()?;
        let count = console.letters()?.count(&query.filter).await?;
        let filter = query.filter_string();
        let verb = match action {
            Bulk::Redrive => "Redrive",
            Bulk::Delete => "Delete",
        };
        let f = &query.filter;
        let body = html! {
            p {
                (verb) " " strong #confirm-count { (count) } " dead letter(s) that match "
                @if f.is_empty() { "no filter (every letter)" } @else {
                    @if let Some(job) = &f.job { "job = " code { (job) } " " }
                    @if let Some(reason) = f.reason { "reason = " code { (reason.as_str()) } " " }
                    @if let Some(key) = &f.key { "key = " code { (key) } " " }
                    @if let Some(text) = &f.text { "error contains " code { (text) } }
                }
                "?"
            }
            p.muted { "Exactly these " (count) " are acted on: if the count has changed by the time you confirm, nothing is done and you are asked again." }
            form method="post" action={ (base) "/dead-letters/bulk?" (with_action(&filter, action.as_str())) } {
                input type="hidden" name="expect" value=(count);
                button #confirm .danger[action == Bulk::Delete] .act[action == Bulk::Redrive] type="submit" { (verb) " " (count) " letter(s)" }
                " "
                a href={ (base) "/dead-letters?" (filter) } { "Cancel" }
            }
        };
        Ok(layout(&console, &base, &format!("{verb} all that match?"), None, body))
    }
    .await;
    match out {
        Ok(page) => page.into_response(),
        Err(problem) => problem_page(&console, &base, &problem),
    }
}

async fn bulk(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    query: Pairs,
    fields: Fields,
) -> Response {
    let base = base(&original, &parts);
    let out: Result<Response, Problem> = async {
        let (query, rest) = Query::parse(&pairs(query)?, &["action"])?;
        let action = bulk_action(&rest)?;
        let fields = form(fields)?;
        let expect = field(&fields, "expect")?.parse::<u64>().map_err(|_| {
            Problem::new(
                400,
                "bad-body",
                "Malformed form",
                "`expect` must be the number of letters the confirmation page showed.",
            )
        })?;
        let outcome = console
            .bulk(action, &query.filter, expect, actor_of(&parts).as_deref())
            .await?;
        let verb = match action {
            Bulk::Redrive => "Redriven",
            Bulk::Delete => "Deleted",
        };
        let mut notice = format!("{verb} {} letter(s).", outcome.done);
        if outcome.failed_count > 0 {
            let first = outcome
                .failed
                .first()
                .map(|(id, e)| format!(" First: {id}: {e}"))
                .unwrap_or_default();
            notice.push_str(&format!(
                " {} failed and were kept.{first}",
                outcome.failed_count
            ));
        }
        Ok(see_other(format!(
            "{base}/dead-letters?{}",
            with_notice(&query.filter_string(), &notice)
        )))
    }
    .await;
    out.unwrap_or_else(|problem| problem_page(&console, &base, &problem))
}

fn form(fields: Fields) -> Result<Vec<(String, String)>, Problem> {
    fields
        .map(|Form(f)| f)
        .map_err(|e| Problem::new(400, "bad-body", "Malformed form", e.body_text()))
}

fn field<'f>(fields: &'f [(String, String)], name: &str) -> Result<&'f str, Problem> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| {
            Problem::new(
                400,
                "bad-body",
                "Malformed form",
                format!("The form has no `{name}`: send it from the console's own page."),
            )
        })
}

fn letter_body(
    console: &Console,
    base: &str,
    id: &str,
    entry: &Result<DeadLetter, Error>,
    failure: Option<&str>,
) -> Markup {
    html! {
        @if let Some(failure) = failure {
            div.problem #redrive-error { strong { "The job failed again; the letter is kept." } br; (failure) }
        }
        @match entry {
            Ok(l) => {
                dl #letter {
                    dt { "id" } dd { (id) }
                    dt { "job" } dd { (l.job) }
                    dt { "key" } dd { (l.key.as_deref().unwrap_or("—")) }
                    dt { "reason" } dd { (l.reason.as_str()) }
                    dt { "attempts" } dd { (l.attempts) }
                    dt { "first attempt" } dd { (time(l.first_attempt)) }
                    dt { "last attempt" } dd { (time(l.last_attempt)) }
                    dt { "error" } dd { pre #error { (l.error) } }
                    @if !l.history.is_empty() {
                        dt { "history" } dd { ol { @for e in &l.history { li { (e) } } } }
                    }
                    dt { "payload" } dd {
                        @match &l.payload {
                            Some(p) => pre #payload { (serde_json::to_string_pretty(p).unwrap_or_default()) },
                            None => span.muted { "none (the job declared no payload)" },
                        }
                    }
                }
            }
            Err(e) => { p.corrupt { "This entry is not a letter this build reads: " (e) } }
        }
        @if !console.read_only {
            p.bar {
                @if entry.is_ok() {
                    form.inline method="post" action={ (base) "/dead-letters/" (encode_component(id)) "/redrive" } {
                        button #redrive .act type="submit" { "Redrive" }
                    }
                    " "
                }
                form.inline method="post" action={ (base) "/dead-letters/" (encode_component(id)) "/delete" } {
                    button #delete .danger type="submit" { "Delete" }
                }
            }
        }
        p { a href={ (base) "/dead-letters" } { "← All dead letters" } }
    }
}

async fn letter(State(console): Shared, original: OriginalUri, parts: Parts, id: Id) -> Response {
    let base = base(&original, &parts);
    let out: Result<Markup, Problem> = async {
        let id = path(id)?;
        let entry = console.entry(&id).await?;
        let body = letter_body(&console, &base, &id, &entry, None);
        Ok(layout(
            &console,
            &base,
            &format!("Dead letter {id}"),
            None,
            body,
        ))
    }
    .await;
    match out {
        Ok(page) => page.into_response(),
        Err(problem) => problem_page(&console, &base, &problem),
    }
}

async fn redrive(State(console): Shared, original: OriginalUri, parts: Parts, id: Id) -> Response {
    let base = base(&original, &parts);
    let out: Result<Response, Problem> = async {
        let id = path(id)?;
        match console.redrive_one(&id, actor_of(&parts).as_deref()).await {
            Ok(()) => Ok(see_other(format!(
                "{base}/dead-letters?{}",
                with_notice(
                    "",
                    &format!("Redriven letter {id}: the job ran and the letter is gone.")
                )
            ))),
            Err(problem) if problem.kind == "redrive-failed" => {
                let error = problem
                    .extra
                    .iter()
                    .find(|(n, _)| *n == "error")
                    .and_then(|(_, v)| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let entry = console.entry(&id).await?;
                let body = letter_body(&console, &base, &id, &entry, Some(&error));
                Ok((
                    StatusCode::BAD_GATEWAY,
                    layout(&console, &base, &format!("Dead letter {id}"), None, body),
                )
                    .into_response())
            }
            Err(problem) => Err(problem),
        }
    }
    .await;
    out.unwrap_or_else(|problem| problem_page(&console, &base, &problem))
}

async fn delete(State(console): Shared, original: OriginalUri, parts: Parts, id: Id) -> Response {
    let base = base(&original, &parts);
    let out: Result<Response, Problem> = async {
        let id = path(id)?;
        console.delete_one(&id, actor_of(&parts).as_deref()).await?;
        Ok(see_other(format!(
            "{base}/dead-letters?{}",
            with_notice("", &format!("Deleted letter {id}."))
        )))
    }
    .await;
    out.unwrap_or_else(|problem| problem_page(&console, &base, &problem))
}

async fn keys(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    query: Pairs,
) -> Response {
    let base = base(&original, &parts);
    let out: Result<Markup, Problem> = async {
        let pairs = pairs(query)?;
        let get = |name: &str| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.trim().to_owned()).filter(|v| !v.is_empty());
        let (scope, key, notice) = (get("scope"), get("key"), get("notice"));
        if let Some((name, _)) = pairs.iter().find(|(n, _)| !matches!(n.as_str(), "scope" | "key" | "notice")) {
            return Err(Problem::new(400, "bad-query", "Malformed query", format!("unknown parameter `{name}`: a key is looked up by scope and key.")));
        }
        let info = match (&scope, &key) {
            (Some(scope), Some(key)) => Some(console.key(scope, key).await?),
            _ => None,
        };
        let body = html! {
            form #lookup method="get" action={ (base) "/keys" } {
                input name="scope" placeholder="scope (payments.charge)" value=[scope.as_deref()];
                input name="key" placeholder="key" value=[key.as_deref()];
                button #look type="submit" { "Look up" }
            }
            @if let (Some(scope), Some(key), Some(info)) = (&scope, &key, &info) {
                dl #key {
                    dt { "scope" } dd { (scope) }
                    dt { "key" } dd { (key) }
                    dt { "state" } dd #state { (info.state.as_str()) }
                    dt { "generation" } dd { (info.generation.map(|g| g.to_string()).unwrap_or_else(|| "—".into())) }
                    dt { "crashes" } dd #crashes { (info.crashes) }
                    @if let Some(left) = info.lease_left {
                        dt { "lease ends" } dd {
                            (rfc3339(SystemTime::now() + left))
                            @if left.is_zero() { " (ended: the claim was abandoned; the next claim takes it over and counts a crash)" }
                        }
                    }
                    @if let Some(result) = &info.result {
                        dt { "result" } dd { pre { (serde_json::to_string_pretty(&result_json(result)).unwrap_or_default()) } }
                    }
                }
                @if !console.read_only {
                    p.bar {
                        @if matches!(info.state, KeyState::Poisoned) || info.crashes > 0 || (info.state == KeyState::Claimed && info.lease_left.is_some_and(|l| l.is_zero())) {
                            form.inline method="post" action={ (base) "/keys/forgive" } {
                                input type="hidden" name="scope" value=(scope);
                                input type="hidden" name="key" value=(key);
                                button #forgive .act type="submit" { "Forgive its crashes" }
                            }
                            " "
                        }
                        @if info.state != KeyState::Free || info.generation.is_some() {
                            form.inline method="post" action={ (base) "/keys/forget" } {
                                input type="hidden" name="scope" value=(scope);
                                input type="hidden" name="key" value=(key);
                                button #forget .danger type="submit" { "Forget the key (the job may run again)" }
                            }
                        }
                    }
                }
            }
        };
        Ok(layout(&console, &base, "Idempotency keys", notice.as_deref(), body))
    }
    .await;
    match out {
        Ok(page) => page.into_response(),
        Err(problem) => problem_page(&console, &base, &problem),
    }
}

async fn forgive(state: Shared, original: OriginalUri, parts: Parts, fields: Fields) -> Response {
    key_action(state, original, parts, fields, KeyAction::Forgive).await
}

async fn forget(state: Shared, original: OriginalUri, parts: Parts, fields: Fields) -> Response {
    key_action(state, original, parts, fields, KeyAction::Forget).await
}

async fn key_action(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    fields: Fields,
    action: KeyAction,
) -> Response {
    let base = base(&original, &parts);
    let out: Result<Response, Problem> = async {
        let fields = form(fields)?;
        let (scope, key) = (field(&fields, "scope")?, field(&fields, "key")?);
        let done = console
            .key_action(action, scope, key, actor_of(&parts).as_deref())
            .await?;
        let notice = match (action, done) {
            (KeyAction::Forgive, true) => {
                "Forgiven: the key's crashes are cleared and its job runs again."
            }
            (KeyAction::Forgive, false) => {
                "Nothing to forgive: no crashes, no poison, no abandoned claim."
            }
            (KeyAction::Forget, true) => "Forgotten: the next claim runs the job as new.",
            (KeyAction::Forget, false) => {
                "Nothing to forget: the store holds no record of this key."
            }
        };
        let query = format!(
            "scope={}&key={}",
            encode_component(scope),
            encode_component(key)
        );
        Ok(see_other(format!(
            "{base}/keys?{}",
            with_notice(&query, notice)
        )))
    }
    .await;
    out.unwrap_or_else(|problem| problem_page(&console, &base, &problem))
}

async fn breakers(
    State(console): Shared,
    original: OriginalUri,
    parts: Parts,
    query: Pairs,
) -> Response {
    let base = base(&original, &parts);
    let notice = pairs(query).ok().and_then(|p| notice_of(&p));
    let body = html! {
        table #breakers {
            thead { tr { th { "name" } th { "state" } th { "failures" } th { "probe in" } th {} } }
            tbody {
                @for (name, breaker) in &console.breakers {
                    tr data-name=(name) {
                        td { (name) }
                        td { (breaker.state().as_str()) }
                        td { (breaker.failures()) }
                        td { (format!("{:.1} s", breaker.retry_in().as_secs_f64())) }
                        td {
                            @if !console.read_only {
                                form.inline method="post" action={ (base) "/breakers/" (encode_component(name)) "/reset" } {
                                    button .act type="submit" { "Reset (close)" }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if console.breakers.is_empty() { p.muted { "No breakers registered (Console::breaker)." } }
    };
    layout(&console, &base, "Circuit breakers", notice.as_deref(), body).into_response()
}

async fn reset(State(console): Shared, original: OriginalUri, parts: Parts, name: Id) -> Response {
    let base = base(&original, &parts);
    let out = path(name).and_then(|name| {
        console.reset_breaker(&name, actor_of(&parts).as_deref())?;
        Ok(see_other(format!(
            "{base}/breakers?{}",
            with_notice("", &format!("Breaker {name} reset: closed."))
        )))
    });
    out.unwrap_or_else(|problem| problem_page(&console, &base, &problem))
}
