//! Classification: what one error says about trying again.

use std::time::{Duration, SystemTime};

/// What one failure says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A second try can succeed: retry on the policy's backoff curve.
    Retry,
    /// A second try can succeed after this long (a `Retry-After` header): wait exactly this.
    RetryAfter(Duration),
    /// Permanent: retrying cannot help; give up now.
    Fail,
}

impl Verdict {
    /// `true` unless the verdict is [`Verdict::Fail`].
    pub const fn is_retryable(self) -> bool {
        !matches!(self, Verdict::Fail)
    }
}

impl From<bool> for Verdict {
    /// `true` retries on the curve, `false` fails.
    fn from(retry: bool) -> Self {
        if retry { Verdict::Retry } else { Verdict::Fail }
    }
}

/// An error that knows whether a second try can succeed.
///
/// `#[retry(on = transient)]` (the default) asks the error this. Implement it by hand, or derive
/// it: variants marked `#[transient]` retry, `#[transient(after = field)]` retries after the
/// `Duration` (or `Option<Duration>`) in `field`, `#[transient(from)]` asks the variant's single
/// field, and unmarked variants are permanent.
///
#[cfg_attr(feature = "macros", doc = "```")]
#[cfg_attr(not(feature = "macros"), doc = "```ignore")]
/// use jobguard::{Transient, Verdict};
/// use std::time::Duration;
///
/// #[derive(Debug, Transient)]
/// enum GatewayError {
///     #[transient]
///     Timeout,
///     #[transient(after = retry_after)]
///     RateLimited { retry_after: Duration },
///     #[transient(from)]
///     Io(std::io::Error),
///     Declined,
/// }
///
/// assert_eq!(GatewayError::Timeout.verdict(), Verdict::Retry);
/// let limited = GatewayError::RateLimited { retry_after: Duration::from_secs(2) };
/// assert_eq!(limited.verdict(), Verdict::RetryAfter(Duration::from_secs(2)));
/// assert_eq!(GatewayError::Declined.verdict(), Verdict::Fail);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say whether a failure is transient",
    label = "`#[retry(on = transient)]` needs `{Self}: jobguard::Transient`",
    note = "derive it with `#[derive(jobguard::Transient)]` and mark the retryable variants `#[transient]`, implement `jobguard::Transient` by hand, or pass a classifier: `#[retry(on = my_classifier)]` / `#[retry(on = all)]`"
)]
pub trait Transient {
    /// Whether, and when, a second try can succeed.
    fn verdict(&self) -> Verdict;
}

impl<T: Transient + ?Sized> Transient for &T {
    fn verdict(&self) -> Verdict {
        (**self).verdict()
    }
}

impl<T: Transient + ?Sized> Transient for Box<T> {
    fn verdict(&self) -> Verdict {
        (**self).verdict()
    }
}

impl Transient for std::io::Error {
    /// Connection refused, reset and aborted, timed out, broken pipe, interrupted, would-block and
    /// unexpected EOF are transient; everything else (not found, permission denied, invalid input
    /// or data, ...) is permanent.
    fn verdict(&self) -> Verdict {
        use std::io::ErrorKind::*;
        match self.kind() {
            ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut | BrokenPipe
            | Interrupted | WouldBlock | UnexpectedEof => Verdict::Retry,
            _ => Verdict::Fail,
        }
    }
}

impl Transient for tokio::time::error::Elapsed {
    /// A timeout is transient.
    fn verdict(&self) -> Verdict {
        Verdict::Retry
    }
}

impl Transient for crate::Error {
    /// `InProgress`, `Timeout` and `Store` are transient. `CircuitOpen` is not retried by the loop
    /// that saw it (the breaker decides when to try again), and `KeyReused`, `Budget`,
    /// `LeaseLost`, `Corrupt`, `Poisoned`, `Unreplayable` and `Config` are permanent.
    fn verdict(&self) -> Verdict {
        use crate::Error::*;
        match self {
            InProgress | Timeout | Store(_) => Verdict::Retry,
            _ => Verdict::Fail,
        }
    }
}

#[cfg(feature = "postgres")]
impl Transient for sqlx::Error {
    /// Transient: a serialization failure (`40001`) or deadlock (`40P01`), a lock not available
    /// (`55P03`), too many connections (`53300`), a server shutting down or starting
    /// (`57P01`..`57P03`), a connection exception (class `08`), a lost connection (an I/O error
    /// of a transient kind), a pool timeout and a crashed pool worker. Everything else is
    /// permanent: constraint violations (unique, check, foreign key, not null), syntax and type
    /// errors, a closed pool, rows not found, decoding errors, configuration and TLS errors.
    ///
    /// A serialization failure is retried by retrying the whole transaction; inside one, only a
    /// savepoint's rollback lets a deadlocked statement run again
    /// ([`savepoint`](crate::store::postgres::savepoint)).
    fn verdict(&self) -> Verdict {
        match self {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("40001" | "40P01" | "55P03" | "53300" | "57P01" | "57P02" | "57P03") => {
                    Verdict::Retry
                }
                Some(code) if code.starts_with("08") => Verdict::Retry,
                _ => Verdict::Fail,
            },
            sqlx::Error::Io(e) => e.verdict(),
            sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => Verdict::Retry,
            _ => Verdict::Fail,
        }
    }
}

/// The verdict for an HTTP response status, honouring its `Retry-After` header.
///
/// 408, 429, 500, 502, 503 and 504 are retryable; every other status fails. `Retry-After` is read
/// as delta-seconds (`"120"`) or an HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`); a date in the
/// past means "now", and a malformed header falls back to the backoff curve.
///
/// ```
/// use jobguard::{http_verdict, Verdict};
/// use std::time::Duration;
///
/// assert_eq!(http_verdict(503, Some("7")), Verdict::RetryAfter(Duration::from_secs(7)));
/// assert_eq!(http_verdict(429, Some("soon")), Verdict::Retry);
/// assert_eq!(http_verdict(404, Some("7")), Verdict::Fail);
/// ```
pub fn http_verdict(status: u16, retry_after: Option<&str>) -> Verdict {
    http_verdict_at(status, retry_after, SystemTime::now())
}

pub(crate) fn http_verdict_at(status: u16, retry_after: Option<&str>, now: SystemTime) -> Verdict {
    match status {
        408 | 429 | 500 | 502 | 503 | 504 => {
            match retry_after.and_then(|h| parse_retry_after(h, now)) {
                Some(d) => Verdict::RetryAfter(d),
                None => Verdict::Retry,
            }
        }
        _ => Verdict::Fail,
    }
}

fn parse_retry_after(header: &str, now: SystemTime) -> Option<Duration> {
    let header = header.trim();
    if !header.is_empty() && header.bytes().all(|b| b.is_ascii_digit()) {
        return header.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(header).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error as IoError, ErrorKind};

    #[test]
    fn io_kinds() {
        for k in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::TimedOut,
            ErrorKind::BrokenPipe,
            ErrorKind::Interrupted,
            ErrorKind::WouldBlock,
            ErrorKind::UnexpectedEof,
        ] {
            assert_eq!(IoError::from(k).verdict(), Verdict::Retry, "{k:?}");
        }
        for k in [
            ErrorKind::NotFound,
            ErrorKind::PermissionDenied,
            ErrorKind::InvalidInput,
            ErrorKind::InvalidData,
            ErrorKind::AlreadyExists,
            ErrorKind::Other,
        ] {
            assert_eq!(IoError::from(k).verdict(), Verdict::Fail, "{k:?}");
        }
    }

    #[test]
    fn http_statuses() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert_eq!(http_verdict(s, None), Verdict::Retry, "{s}");
        }
        for s in [200, 400, 401, 403, 404, 409, 422, 501, 505] {
            assert_eq!(http_verdict(s, None), Verdict::Fail, "{s}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let v = |h| http_verdict_at(503, Some(h), now);
        assert_eq!(v("120"), Verdict::RetryAfter(Duration::from_secs(120)));
        assert_eq!(v(" 0 "), Verdict::RetryAfter(Duration::ZERO));
        assert_eq!(
            v("Wed, 21 Oct 2015 07:28:30 GMT"),
            Verdict::RetryAfter(Duration::from_secs(30))
        );
        // A date in the past means "now".
        assert_eq!(
            v("Wed, 21 Oct 2015 07:27:00 GMT"),
            Verdict::RetryAfter(Duration::ZERO)
        );
        // Malformed: back to the curve.
        for bad in [
            "",
            "-5",
            "1.5",
            "soon",
            "99999999999999999999999",
            "Wed, 32 Oct 2015 07:28:00 GMT",
        ] {
            assert_eq!(v(bad), Verdict::Retry, "{bad:?}");
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn sqlx_errors_without_a_server() {
        let lost = sqlx::Error::Io(IoError::from(ErrorKind::ConnectionReset));
        assert_eq!(lost.verdict(), Verdict::Retry);
        assert_eq!(sqlx::Error::PoolTimedOut.verdict(), Verdict::Retry);
        assert_eq!(sqlx::Error::PoolClosed.verdict(), Verdict::Fail);
        assert_eq!(sqlx::Error::RowNotFound.verdict(), Verdict::Fail);
        assert_eq!(sqlx::Error::Protocol("bad".into()).verdict(), Verdict::Fail);
    }

    #[test]
    fn runtime_errors() {
        assert_eq!(crate::Error::InProgress.verdict(), Verdict::Retry);
        assert_eq!(crate::Error::Timeout.verdict(), Verdict::Retry);
        assert_eq!(crate::Error::KeyReused.verdict(), Verdict::Fail);
        assert_eq!(
            crate::Error::Poisoned { crashes: 3 }.verdict(),
            Verdict::Fail,
            "a poison job is never retried"
        );
        assert_eq!(
            crate::Error::Unreplayable("why".into()).verdict(),
            Verdict::Fail
        );
        assert_eq!(crate::Error::Config("why".into()).verdict(), Verdict::Fail);
        assert_eq!(
            crate::Error::CircuitOpen {
                retry_in: Duration::from_secs(1)
            }
            .verdict(),
            Verdict::Fail
        );
    }
}
