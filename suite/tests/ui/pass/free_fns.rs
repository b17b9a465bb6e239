//! Free functions: plain, generic (bounds, where clauses, lifetimes), `impl Trait` arguments,
//! `return Err(..)` and `?` with a `From` conversion inside the body, and `io::Result<T>`.

use jobguard::Transient;
use std::fmt::Display;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Transient)]
enum GatewayError {
    #[transient]
    Timeout,
    #[transient(from)]
    Io(io::Error),
    Declined,
}

impl Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Timeout => f.write_str("gateway timeout"),
            GatewayError::Io(e) => write!(f, "i/o: {e}"),
            GatewayError::Declined => f.write_str("declined"),
        }
    }
}

impl From<io::Error> for GatewayError {
    fn from(e: io::Error) -> Self {
        GatewayError::Io(e)
    }
}

static CALLS: AtomicU32 = AtomicU32::new(0);

#[jobguard::retry(attempts = 3, base = "1ms", cap = "2ms", jitter = none)]
async fn charge(order_id: &str, amount: u64) -> Result<String, GatewayError> {
    if CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(GatewayError::Timeout);
    }
    Ok(format!("{order_id}:{amount}"))
}

fn read(fail: bool) -> io::Result<u64> {
    if fail {
        Err(io::Error::from(io::ErrorKind::ConnectionReset))
    } else {
        Ok(7)
    }
}

// `?` converts `io::Error` into the function's error type, as it does without the attribute.
#[jobguard::retry(attempts = 2, base = "1ms")]
async fn with_question_mark(fail: bool) -> Result<u64, GatewayError> {
    let n = read(fail)?;
    if n == 0 {
        return Err(GatewayError::Declined);
    }
    Ok(n)
}

#[jobguard::retry(attempts = 2, base = "1ms")]
async fn io_result(path: &str) -> io::Result<usize> {
    Ok(path.len())
}

// `µs` and `us` both spell microseconds.
#[jobguard::retry(attempts = 2, base = "5µs", cap = "20us")]
async fn micros(n: u32) -> Result<u32, GatewayError> {
    Ok(n)
}

#[jobguard::retry]
async fn generic<T: Display>(value: T) -> Result<String, GatewayError> {
    Ok(value.to_string())
}

#[jobguard::retry(attempts = 2)]
async fn with_where<T, U>(a: T, b: U) -> Result<String, GatewayError>
where
    T: Display + Sync,
    U: Display + Sync,
{
    Ok(format!("{a}{b}"))
}

#[jobguard::retry(attempts = 2)]
async fn with_lifetimes<'a, 'b: 'a>(
    first: &'a str,
    second: &'b str,
) -> Result<&'a str, GatewayError> {
    Ok(if first.len() >= second.len() {
        first
    } else {
        second
    })
}

#[jobguard::retry(attempts = 2)]
async fn impl_trait(
    label: impl Display,
    items: impl IntoIterator<Item = u32> + Clone,
) -> Result<String, GatewayError> {
    let total: u32 = items.clone().into_iter().sum();
    Ok(format!("{label}={total}"))
}

#[jobguard::retry(attempts = 2)]
pub(crate) async fn no_parameters() -> Result<(), GatewayError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    assert_eq!(charge("order-A", 100).await.unwrap(), "order-A:100");
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    assert_eq!(with_question_mark(false).await.unwrap(), 7);
    assert!(matches!(
        with_question_mark(true).await,
        Err(GatewayError::Io(_))
    ));
    assert_eq!(io_result("abc").await.unwrap(), 3);
    assert_eq!(micros(4).await.unwrap(), 4);
    assert_eq!(generic(5).await.unwrap(), "5");
    assert_eq!(with_where("a", 1).await.unwrap(), "a1");
    assert_eq!(with_lifetimes("ab", "c").await.unwrap(), "ab");
    assert_eq!(impl_trait("sum", vec![1, 2, 3]).await.unwrap(), "sum=6");
    no_parameters().await.unwrap();
}
