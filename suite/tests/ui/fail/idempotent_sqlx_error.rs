// `sqlx::Error` as the job's error: one error in words on it, with an example, rather than rustc's
// "`jobguard::Error: DatabaseError` is not satisfied" from sqlx's blanket `From`. In a
// transaction, with `#[retry]`, with a store, and spelt `sqlx::Result<T>`.
use sqlx::PgConnection;

#[jobguard::idempotent(key = id, transaction = tx)]
async fn transfer(tx: &mut PgConnection, id: &str) -> Result<u64, sqlx::Error> {
    let _ = tx;
    Ok(id.len() as u64)
}

#[jobguard::idempotent(key = id, transaction = tx)]
#[jobguard::retry(attempts = 3)]
async fn retried(tx: &mut PgConnection, id: &str) -> Result<u64, ::sqlx::Error> {
    let _ = tx;
    Ok(id.len() as u64)
}

#[jobguard::idempotent(key = id)]
async fn stored(id: &str) -> Result<u64, sqlx::error::Error> {
    Ok(id.len() as u64)
}

#[jobguard::idempotent(key = id, transaction = tx)]
async fn aliased(tx: &mut PgConnection, id: &str) -> sqlx::Result<u64> {
    let _ = tx;
    Ok(id.len() as u64)
}

fn main() {}
