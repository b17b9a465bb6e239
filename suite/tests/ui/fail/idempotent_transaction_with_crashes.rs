use sqlx::PgConnection;

#[jobguard::idempotent(key = order_id, transaction = tx, crashes = 3)]
async fn charge(tx: &mut PgConnection, order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = (tx, order_id);
    Ok(1)
}

fn main() {}
