use sqlx::PgPool;

#[jobguard::idempotent(key = order_id, transaction = pool)]
async fn charge(pool: &PgPool, order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = (pool, order_id);
    Ok(1)
}

#[jobguard::idempotent(key = order_id, transaction = tx)]
async fn shared(tx: &sqlx::PgConnection, order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = (tx, order_id);
    Ok(1)
}

#[jobguard::idempotent(key = order_id, transaction = conn.inner)]
async fn field(conn: &mut sqlx::PgConnection, order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = (conn, order_id);
    Ok(1)
}

fn main() {}
