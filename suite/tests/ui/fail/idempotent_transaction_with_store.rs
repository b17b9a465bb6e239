use sqlx::PgConnection;

static STORE: std::sync::LazyLock<jobguard::MemoryStore> =
    std::sync::LazyLock::new(jobguard::MemoryStore::new);

#[jobguard::idempotent(key = order_id, transaction = tx, store = STORE, lease = "10s")]
async fn charge(tx: &mut PgConnection, order_id: &str) -> Result<u64, jobguard::Error> {
    let _ = (tx, order_id);
    Ok(1)
}

fn main() {}
