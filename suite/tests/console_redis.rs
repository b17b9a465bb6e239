//! The console's JSON API over `RedisDeadLetters` and `RedisStore` on a private `redis-server`:
//! every route, the filters and pagination over 10,000 letters, the `409` on a stale count and
//! the `403`s of a read-only console, through a real HTTP client on a loopback socket.

mod console_support;

use console_support::{LETTERS, console, exercise, letter, listening};
use jobguard::dead_letter::encode;
use jobguard::{RedisDeadLetters, RedisStore};
use jobguard_testkit::redis::RedisServer;

const STREAM: &str = "tests:console:letters";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_ten_thousand_letters_in_a_redis_stream() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let letters = RedisDeadLetters::connect(&server.url(), STREAM)
        .await
        .unwrap()
        .max_len(1_000_000);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    // The letters in the order of `letter(i)`, then one entry that is not a letter.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for chunk in (0..LETTERS).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("XADD")
                .arg(STREAM)
                .arg("*")
                .arg("letter")
                .arg(encode(&letter(*i)))
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await.unwrap();
    }
    redis::cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("letter")
        .arg("{not a letter")
        .query_async::<String>(&mut conn)
        .await
        .unwrap();

    let (read_only, _) = console(letters.clone(), store.clone(), listening().0);
    exercise(letters, store, read_only, true).await;
}
