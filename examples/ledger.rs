//! Transfers between two accounts, each delivered twice (as a queue does), each moved once.
//!
//! ```text
//! cargo run --example ledger                                  # in memory
//! cargo run --example ledger -- --postgres postgres://u@h/db  # the key in the transfer's transaction
//! ```
//!
//! With `--postgres`, a transfer's idempotency key is inserted in the same transaction as its two
//! balance updates (`#[idempotent(key = t.id, transaction = tx)]`), and that transaction commits all three or none:
//! a worker that dies before the commit leaves no trace, and one that commits leaves the key that
//! makes every redelivery a replay. There is no window between the effect and the key.
//!
//! Without it, the example runs on the embedded default store, in memory. That store cannot share
//! a transaction with anything, so the balances and the key are two writes: jobguard claims the
//! key, the transfer runs, the result is stored. Redeliveries still replay, but a crash between
//! the transfer and the result's write could run it again. The transactional form needs Postgres.

use jobguard::PgStore;
use jobguard::idempotency::Idempotent;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One transfer, as the queue delivers it.
#[derive(Debug, Clone)]
pub struct Transfer {
    /// The business id: the idempotency key.
    pub id: String,
    /// The account debited.
    pub from: String,
    /// The account credited.
    pub to: String,
    /// The amount, in cents.
    pub amount: i64,
}

/// What a transfer returns, and what a redelivery replays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// The transfer's id.
    pub id: String,
    /// The debited account's balance right after the transfer.
    pub from_balance: i64,
}

/// Why a transfer failed.
#[derive(Debug)]
pub enum LedgerError {
    /// The database refused or could not be reached.
    Db(sqlx::Error),
    /// jobguard could not claim or store the key.
    Guard(jobguard::Error),
    /// The debited account has less than the amount.
    InsufficientFunds(String),
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        LedgerError::Db(e)
    }
}

impl From<jobguard::Error> for LedgerError {
    fn from(e: jobguard::Error) -> Self {
        LedgerError::Guard(e)
    }
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Db(e) => write!(f, "database: {e}"),
            LedgerError::Guard(e) => write!(f, "{e}"),
            LedgerError::InsufficientFunds(account) => write!(f, "insufficient funds in {account}"),
        }
    }
}

impl std::error::Error for LedgerError {}

/// The transfers of the example: alice pays bob twice, bob pays carol once.
pub fn transfers() -> Vec<Transfer> {
    [
        ("t-1", "alice", "bob", 30),
        ("t-2", "alice", "bob", 20),
        ("t-3", "bob", "carol", 10),
    ]
    .into_iter()
    .map(|(id, from, to, amount)| Transfer {
        id: id.into(),
        from: from.into(),
        to: to.into(),
        amount,
    })
    .collect()
}

/// The opening balances.
pub const OPENING: [(&str, i64); 3] = [("alice", 100), ("bob", 0), ("carol", 0)];

/// One delivery of a transfer, on Postgres: the key, both updates and the receipt in the
/// caller's transaction (`transaction = tx`), which the caller commits.
#[jobguard::idempotent(key = t.id, transaction = tx, scope = "ledger.transfer")]
pub async fn transfer(tx: &mut PgConnection, t: &Transfer) -> Result<Receipt, LedgerError> {
    let from_balance: i64 = sqlx::query_scalar(
        "UPDATE ledger_accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance",
    )
    .bind(&t.from)
    .bind(t.amount)
    .fetch_one(&mut *tx)
    .await?;
    if from_balance < 0 {
        return Err(LedgerError::InsufficientFunds(t.from.clone()));
    }
    sqlx::query("UPDATE ledger_accounts SET balance = balance + $2 WHERE id = $1")
        .bind(&t.to)
        .bind(t.amount)
        .execute(&mut *tx)
        .await?;
    Ok(Receipt {
        id: t.id.clone(),
        from_balance,
    })
}

/// One delivery of a transfer on Postgres: begin, [`transfer`], commit. A worker that dies
/// before the commit leaves neither the updates nor the key.
///
/// When nothing else goes in the transaction, `transfer(&mut pool.acquire().await?, t)` does the
/// same with one round trip fewer: given a connection outside a transaction, jobguard begins one
/// with the key's claim in the `BEGIN`'s message, and commits it after the receipt.
pub async fn transfer_in_postgres(pool: &PgPool, t: &Transfer) -> Result<Receipt, LedgerError> {
    let mut tx = pool.begin().await?;
    let receipt = transfer(&mut tx, t).await?;
    tx.commit().await?;
    Ok(receipt)
}

/// Creates the accounts table (and jobguard's) unless they exist, with the opening balances.
pub async fn open_postgres(url: &str) -> Result<PgPool, Box<dyn std::error::Error>> {
    let store = PgStore::connect(url).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS ledger_accounts (id text PRIMARY KEY, balance bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    for (id, balance) in OPENING {
        sqlx::query("INSERT INTO ledger_accounts VALUES ($1, $2) ON CONFLICT (id) DO NOTHING")
            .bind(id)
            .bind(balance)
            .execute(&pool)
            .await?;
    }
    Ok(pool)
}

/// The balances in Postgres.
pub async fn balances_in_postgres(pool: &PgPool) -> Result<BTreeMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT id, balance FROM ledger_accounts")
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// The in-memory ledger of the embedded mode.
pub struct MemoryLedger {
    balances: Mutex<BTreeMap<String, i64>>,
}

impl Default for MemoryLedger {
    fn default() -> Self {
        let balances = OPENING.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        MemoryLedger {
            balances: Mutex::new(balances),
        }
    }
}

impl MemoryLedger {
    /// One delivery of a transfer, on the embedded default store: claimed, run, result stored.
    pub async fn transfer(&self, t: &Transfer) -> Result<Receipt, LedgerError> {
        Idempotent::new("ledger.transfer", &t.id)
            .run(async {
                let mut balances = self.balances.lock().expect("not poisoned");
                let from_balance = balances[&t.from] - t.amount;
                if from_balance < 0 {
                    return Err(LedgerError::InsufficientFunds(t.from.clone()));
                }
                balances.insert(t.from.clone(), from_balance);
                *balances.entry(t.to.clone()).or_default() += t.amount;
                Ok(Receipt {
                    id: t.id.clone(),
                    from_balance,
                })
            })
            .await
    }

    /// The balances now.
    pub fn balances(&self) -> BTreeMap<String, i64> {
        self.balances.lock().expect("not poisoned").clone()
    }
}

/// Delivers every transfer twice, concurrently, and returns the balances and the receipts (one
/// per delivery, in delivery order).
pub async fn run(
    postgres: Option<&str>,
) -> Result<(BTreeMap<String, i64>, Vec<Receipt>), Box<dyn std::error::Error>> {
    let mut receipts = Vec::new();
    match postgres {
        Some(url) => {
            let pool = open_postgres(url).await?;
            for t in transfers() {
                let (first, second) = tokio::join!(
                    transfer_in_postgres(&pool, &t),
                    transfer_in_postgres(&pool, &t)
                );
                receipts.extend([first?, second?]);
            }
            Ok((balances_in_postgres(&pool).await?, receipts))
        }
        None => {
            let ledger = MemoryLedger::default();
            for t in transfers() {
                let first = ledger.transfer(&t).await?;
                let second = ledger.transfer(&t).await?;
                receipts.extend([first, second]);
            }
            Ok((ledger.balances(), receipts))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let postgres = match args.iter().position(|a| a == "--postgres") {
        Some(i) => Some(args.get(i + 1).ok_or("--postgres needs a URL")?.as_str()),
        None => None,
    };
    match postgres {
        Some(_) => println!("Postgres: each transfer's key commits with its balance updates."),
        None => println!(
            "In memory (the embedded default store). The key and the balances are two writes \
             here; the transactional form needs Postgres: --postgres URL."
        ),
    }
    let (balances, receipts) = run(postgres).await?;
    for pair in receipts.chunks(2) {
        let same = if pair[0] == pair[1] {
            "replayed"
        } else {
            "DIFFERENT"
        };
        println!(
            "{}: delivered twice, {same}: {} left with {}",
            pair[0].id,
            transfers()
                .iter()
                .find(|t| t.id == pair[0].id)
                .map_or("?", |t| t.from.as_str()),
            pair[0].from_balance
        );
    }
    println!("balances (every transfer moved once): {balances:?}");
    Ok(())
}
