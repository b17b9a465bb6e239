//! `key` is any expression over the parameters: a parameter, a field (`order.id`), a string
//! built with `format!`, a method call; `&Order` and owned parameters both work, and the body
//! still uses the parameters the key read.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Serialize, Deserialize)]
struct Receipt {
    order_id: String,
    amount: u64,
}

struct Order {
    id: String,
    amount: u64,
}

impl Order {
    fn reference(&self) -> String {
        format!("ref-{}", self.id)
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[jobguard::idempotent(key = order.id)]
async fn by_field(order: &Order) -> Result<Receipt, jobguard::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        order_id: order.id.clone(),
        amount: order.amount,
    })
}

#[jobguard::idempotent(key = order.id, scope = "tests.ui.owned")]
async fn by_owned_field(order: Order) -> Result<Receipt, jobguard::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        order_id: order.id,
        amount: order.amount,
    })
}

#[jobguard::idempotent(key = format!("{tenant}:{id}"))]
async fn by_format(tenant: &str, id: u64) -> Result<String, jobguard::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{tenant} charged {id}"))
}

#[jobguard::idempotent(key = order.reference(), ttl = "1h", lease = "5s")]
async fn by_method(order: &Order) -> Result<u64, jobguard::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order.amount)
}

#[jobguard::idempotent(key = id, in_progress = wait("1s"))]
async fn by_number(id: u64) -> Result<(), jobguard::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let _ = id;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let order = Order {
        id: "order-A".to_owned(),
        amount: 100,
    };
    for _ in 0..2 {
        assert_eq!(by_field(&order).await.unwrap().amount, 100);
        let owned = Order {
            id: "order-A".to_owned(),
            amount: 100,
        };
        assert_eq!(by_owned_field(owned).await.unwrap().order_id, "order-A");
        assert_eq!(by_format("acme", 7).await.unwrap(), "acme charged 7");
        assert_eq!(by_method(&order).await.unwrap(), 100);
        by_number(7).await.unwrap();
    }
    // The second round replayed every call.
    assert_eq!(RUNS.load(Ordering::SeqCst), 5);
}
