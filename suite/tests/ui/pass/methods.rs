//! Methods: `&self`, `&mut self`, `self: Arc<Self>`, in a generic impl, and `dead_letter` naming
//! a field of `self`.

use jobguard::{MemoryDeadLetters, Transient};
use std::fmt::Display;
use std::sync::Arc;

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

struct Gateway {
    captured: Vec<String>,
    failures: u32,
    letters: MemoryDeadLetters,
}

impl Gateway {
    #[jobguard::retry(attempts = 3, base = "1ms", dead_letter = self.letters)]
    async fn status(&self, order_id: &str) -> Result<String, GatewayError> {
        Ok(format!("{order_id}: {} captured", self.captured.len()))
    }

    #[jobguard::retry(attempts = 3, base = "1ms", jitter = none)]
    async fn capture(&mut self, order_id: &str) -> Result<usize, GatewayError> {
        if self.failures > 0 {
            self.failures -= 1;
            return Err(GatewayError::Timeout);
        }
        self.captured.push(order_id.to_owned());
        Ok(self.captured.len())
    }

    #[jobguard::retry(attempts = 2, base = "1ms")]
    async fn shared(self: Arc<Self>) -> Result<usize, GatewayError> {
        Ok(self.captured.len())
    }

    #[jobguard::retry(attempts = 2, base = "1ms", dead_letter = self.letters)]
    async fn always_times_out(&self) -> Result<(), GatewayError> {
        Err(GatewayError::Timeout)
    }
}

struct Labelled<T>(T);

impl<T: Display + Sync> Labelled<T> {
    #[jobguard::retry(attempts = 2)]
    async fn label(&self, suffix: impl Display) -> Result<String, GatewayError> {
        Ok(format!("{}{suffix}", self.0))
    }
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let mut gateway = Gateway {
        captured: Vec::new(),
        failures: 2,
        letters: MemoryDeadLetters::new(),
    };
    assert_eq!(gateway.capture("order-A").await.unwrap(), 1);
    assert_eq!(
        gateway.status("order-A").await.unwrap(),
        "order-A: 1 captured"
    );
    assert!(gateway.always_times_out().await.is_err());
    assert_eq!(gateway.letters.letters().len(), 1);
    let shared = Arc::new(gateway);
    assert_eq!(shared.clone().shared().await.unwrap(), 1);
    assert_eq!(Labelled(7).label("!").await.unwrap(), "7!");
}
