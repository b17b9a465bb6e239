//! The error of a test's job that calls a flaky dependency: a transient timeout, a permanent
//! refusal, or jobguard's own error (an open breaker, a cut attempt), so that it can be used
//! with `breaker`, `timeout` and `budget`.

use jobguard::Transient;

/// A job's error against a flaky gateway.
#[derive(Debug, PartialEq, Transient)]
pub enum GatewayError {
    /// The gateway timed out: retried.
    #[transient]
    Timeout,
    /// The gateway refused: permanent.
    Declined,
    /// jobguard's own error, retried as `impl Transient for jobguard::Error` says.
    #[transient(from)]
    Jobguard(jobguard::Error),
}

impl From<jobguard::Error> for GatewayError {
    fn from(e: jobguard::Error) -> Self {
        GatewayError::Jobguard(e)
    }
}

impl std::fmt::Display for GatewayError {
    /// jobguard's error as it writes itself, the others by name.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Jobguard(e) => write!(f, "{e}"),
            other => write!(f, "{other:?}"),
        }
    }
}
