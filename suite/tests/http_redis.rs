//! The layer over `RedisStore`: 50 concurrent identical requests spread over two server
//! processes sharing one private `redis-server` run the handler once.

mod http_support;

use http_support::{Client, Handler, app, serve};
use jobguard::RedisStore;
use jobguard::http::IdempotencyLayer;
use jobguard_testkit::redis::{RedisServer, rerun_test};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

/// Marks the lines the child writes for the parent (libtest writes its own lines around them).
const MARK: &str = "jobguard-child:";
const ROLE_ENV: &str = "JOBGUARD_TEST_ROLE";
const URL_ENV: &str = "JOBGUARD_TEST_REDIS_URL";

fn handler() -> Handler {
    Handler {
        work: Duration::from_millis(200),
        ..Handler::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_requests_over_two_processes_run_the_handler_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut child = rerun_test("http_server_process")
        .env(ROLE_ENV, "http-server")
        .env(URL_ENV, server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the second server process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let other: SocketAddr = lines
        .by_ref()
        .find_map(|line| {
            let line = line.expect("child stdout");
            line.find(MARK)
                .map(|at| line[at + MARK.len()..].trim().to_owned())
        })
        .expect("the child says where it listens")
        .parse()
        .unwrap();

    let store = RedisStore::connect(&server.url()).await.unwrap();
    let handler = handler();
    let here = serve(app(handler.clone(), IdempotencyLayer::new(store))).await;
    let clients = [Client::new(here), Client::new(other)];

    let mut requests = tokio::task::JoinSet::new();
    for i in 0..50 {
        let client = clients[i % 2].clone();
        requests.spawn(async move { client.charge("idem-redis").await });
    }
    let (mut ran, mut conflicts, mut replays) = (0, 0, 0);
    while let Some(reply) = requests.join_next().await {
        let reply = reply.unwrap();
        match reply.status.as_u16() {
            201 if reply.replayed() => replays += 1,
            201 => ran += 1,
            409 => {
                reply.problem(409);
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    let there: usize = String::from_utf8(
        clients[1]
            .send("GET", "/runs", None, "")
            .await
            .body
            .to_vec(),
    )
    .unwrap()
    .parse()
    .unwrap();
    assert_eq!(ran, 1);
    assert_eq!(
        handler.runs() + there,
        1,
        "one handler run over both processes"
    );
    assert_eq!(ran + conflicts + replays, 50);
    // Each process replays the stored response.
    for client in &clients {
        assert!(client.charge("idem-redis").await.replayed());
    }
    println!("1 run, {conflicts} conflicts, {replays} replays");

    drop(child.stdin.take()); // the child exits when its stdin closes
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the second server process failed: {status}"
    );
}

/// The second server process of the test above: serves the same app on `RedisStore`, prints its
/// address, and exits when its stdin closes. Does nothing when run on its own.
#[test]
#[ignore = "a child process of fifty_concurrent_requests_over_two_processes_run_the_handler_once"]
fn http_server_process() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("http-server") {
        return;
    }
    let url = std::env::var(URL_ENV).expect("the parent passes the server's URL");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::connect(&url).await.expect("connect");
        let addr = serve(app(handler(), IdempotencyLayer::new(store))).await;
        println!("{MARK} {addr}");
        tokio::task::spawn_blocking(|| {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
        })
        .await
        .unwrap();
    });
}
