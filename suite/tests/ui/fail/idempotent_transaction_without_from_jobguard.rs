// A missing `From<jobguard::Error>` in a transaction is one error in words, with `#[retry]` too
// (whose attempts run in savepoints).
use sqlx::PgConnection;

#[derive(Debug, jobguard::Transient)]
enum TransferError {
    #[transient]
    Busy,
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("busy")
    }
}

#[jobguard::idempotent(key = id, transaction = tx)]
async fn transfer(tx: &mut PgConnection, id: &str) -> Result<u64, TransferError> {
    let _ = tx;
    Ok(id.len() as u64)
}

#[jobguard::idempotent(key = id, transaction = tx)]
#[jobguard::retry(attempts = 3)]
async fn retried(tx: &mut PgConnection, id: &str) -> Result<u64, TransferError> {
    if id.is_empty() {
        return Err(TransferError::Busy);
    }
    let _ = tx;
    Ok(id.len() as u64)
}

fn main() {}
