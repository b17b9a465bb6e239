//! `#[retry]` on methods (`&self`, `&mut self`, `self: Arc<Self>`), generic fns and `impl Trait`
//! arguments: each is retried at run time, the receiver and arguments usable on every attempt.

use jobguard::{MemoryDeadLetters, Runtime, Transient};
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, PartialEq, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
}

impl Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gateway timeout")
    }
}

/// Fails `fail_times` times, then succeeds.
struct Client {
    calls: AtomicU32,
    fail_times: u32,
    log: Vec<u32>,
}

impl Client {
    fn new(fail_times: u32) -> Self {
        Client {
            calls: AtomicU32::new(0),
            fail_times,
            log: Vec::new(),
        }
    }

    fn call(&self) -> Result<u32, GatewayError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.fail_times {
            Err(GatewayError::Timeout)
        } else {
            Ok(n)
        }
    }

    #[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = none)]
    async fn by_ref(&self, label: &str) -> Result<String, GatewayError> {
        let n = self.call()?;
        Ok(format!("{label} on attempt {n}"))
    }

    #[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = none)]
    async fn by_mut(&mut self) -> Result<usize, GatewayError> {
        let n = self.calls.load(Ordering::SeqCst) + 1;
        self.log.push(n);
        self.call()?;
        Ok(self.log.len())
    }

    #[jobguard::retry(attempts = 4, base = "100ms", cap = "1s", jitter = none)]
    async fn by_arc(self: Arc<Self>) -> Result<u32, GatewayError> {
        self.call()
    }
}

fn runtime() -> Runtime {
    Runtime::builder()
        .dead_letters(MemoryDeadLetters::new())
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_shared_ref_method_is_retried() {
    let client = Client::new(2);
    let start = Instant::now();
    let got = runtime().scope(client.by_ref("charge")).await.unwrap();
    assert_eq!(got, "charge on attempt 3");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn a_mut_ref_method_is_retried_and_keeps_each_attempts_mutation() {
    let mut client = Client::new(2);
    let got = runtime().scope(client.by_mut()).await.unwrap();
    assert_eq!(got, 3);
    assert_eq!(client.log, [1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn an_arc_self_method_is_retried() {
    let client = Arc::new(Client::new(3));
    let got = runtime().scope(client.clone().by_arc()).await.unwrap();
    assert_eq!(got, 4);
    assert_eq!(client.calls.load(Ordering::SeqCst), 4);
}

/// Generic over the value and the error: the bounds hold on every attempt.
#[jobguard::retry(attempts = 3, base = "100ms", cap = "1s", jitter = none)]
async fn generic<T, E>(value: &T, attempts: &mut Vec<Result<(), E>>) -> Result<T, E>
where
    T: Clone,
    E: Transient + Display,
{
    attempts.remove(0)?;
    Ok(value.clone())
}

#[tokio::test(start_paused = true)]
async fn a_generic_fn_is_retried_for_each_instantiation() {
    let runtime = runtime();
    let mut script = vec![Err(GatewayError::Timeout), Ok(())];
    let got = runtime
        .scope(generic(&"receipt", &mut script))
        .await
        .unwrap();
    assert_eq!(got, "receipt");
    assert!(script.is_empty());

    let mut script: Vec<Result<(), std::io::Error>> = vec![
        Err(std::io::ErrorKind::ConnectionReset.into()),
        Err(std::io::ErrorKind::TimedOut.into()),
        Ok(()),
    ];
    let start = Instant::now();
    assert_eq!(
        runtime.scope(generic(&42u64, &mut script)).await.unwrap(),
        42
    );
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

/// `impl Trait` arguments are called again on every attempt.
#[jobguard::retry(attempts = 3, base = "100ms", cap = "1s", jitter = none)]
async fn with_impl_trait(
    source: impl Fn() -> Result<u32, GatewayError>,
    label: impl Display,
) -> Result<String, GatewayError> {
    Ok(format!("{label}={}", source()?))
}

#[tokio::test(start_paused = true)]
async fn impl_trait_arguments_are_usable_on_every_attempt() {
    let client = Client::new(2);
    let got = runtime()
        .scope(with_impl_trait(|| client.call(), "n"))
        .await
        .unwrap();
    assert_eq!(got, "n=3");
}
