struct Order {
    id: String,
    amount: u64,
}

#[jobguard::idempotent(key = order)]
async fn charge(order: &Order) -> Result<u64, jobguard::Error> {
    let _ = &order.id;
    Ok(order.amount)
}

fn main() {
    let order = Order {
        id: "order-A".to_owned(),
        amount: 100,
    };
    let _ = charge(&order);
}
