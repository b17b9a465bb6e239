//! The console's JSON API over `PgDeadLetters` and `PgStore` on a private `postgres`: every
//! route, the filters and pagination over 10,000 letters, the `409` on a stale count and the
//! `403`s of a read-only console, through a real HTTP client on a loopback socket.

mod console_support;

use console_support::{LETTERS, console, exercise, letter, listening};
use jobguard::PgStore;
use jobguard::dead_letter::encode;
use jobguard::dead_letter::postgres::PgDeadLetters;
use jobguard_testkit::postgres::PgServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_over_ten_thousand_letters_in_a_postgres_table() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let store = PgStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let letters = PgDeadLetters::new(store.pool().clone());
    // The letters in the order of `letter(i)`, through `add` for the first few, then in bulk;
    // then one row whose record is not a letter.
    for i in 0..10 {
        letters.add(&letter(i)).await.unwrap();
    }
    for chunk in (10..LETTERS).collect::<Vec<_>>().chunks(1000) {
        let mut q = sqlx::QueryBuilder::new(
            "INSERT INTO jobguard_dead_letters (job, key, reason, error, record) ",
        );
        q.push_values(chunk, |mut row, i| {
            let l = letter(*i);
            row.push_bind(l.job.clone())
                .push_bind(l.key.clone())
                .push_bind(l.reason.as_str())
                .push_bind(l.error.clone())
                .push_bind(encode(&l));
        });
        q.build().execute(store.pool()).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO jobguard_dead_letters (job, key, reason, error, record) \
         VALUES ('x', NULL, 'exhausted', 'x', '{not a letter')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(letters.len().await.unwrap(), LETTERS + 1);

    let (read_only, _) = console(letters.clone(), store.clone(), listening().0);
    exercise(letters, store, read_only, true).await;
}
