//! The bounds the attributes put on a job's types, each named so that a missing one is one
//! error in words, and the small functions expansions call to classify and to key. Expansions
//! reach them through `__private`; the crate's own modules import them from here.

use crate::{Transient, Verdict};
use core::time::Duration;

/// `on = transient`: the error's own verdict.
#[inline]
pub fn transient<E: Transient>(error: &E) -> Verdict {
    error.verdict()
}

/// `#[transient(after = field)]`: the field's `Duration`, or the curve when it is `None`.
#[inline]
pub fn after<D: RetryAfter + ?Sized>(field: &D) -> Verdict {
    match field.retry_after() {
        Some(d) => Verdict::RetryAfter(d),
        None => Verdict::Retry,
    }
}

/// A field that `#[transient(after = field)]` can read.
#[diagnostic::on_unimplemented(
    message = "`#[transient(after = ...)]` needs a `Duration` or `Option<Duration>` field, not `{Self}`"
)]
pub trait RetryAfter {
    /// The wait the field asks for.
    fn retry_after(&self) -> Option<Duration>;
}
impl RetryAfter for Duration {
    fn retry_after(&self) -> Option<Duration> {
        Some(*self)
    }
}
impl RetryAfter for Option<Duration> {
    fn retry_after(&self) -> Option<Duration> {
        *self
    }
}

/// `on = path`: the classifier's verdict on the error.
#[inline(always)]
pub fn classify<E, C: FnOnce(&E) -> V, V: IntoVerdict>(classifier: C, error: &E) -> Verdict {
    classifier(error).into_verdict()
}

/// What an `on` classifier returns: a [`Verdict`], or a `bool` (`true` retries); named so that
/// another return type is one error in words.
#[diagnostic::on_unimplemented(
    message = "a classifier returns `jobguard::Verdict` or `bool`, not `{Self}`",
    label = "`on` needs a `fn(&E) -> jobguard::Verdict` or `fn(&E) -> bool`",
    note = "return `Verdict::Retry` (or `true`) to retry the failure, `Verdict::RetryAfter(d)` to retry after `d`, and `Verdict::Fail` (or `false`) to give up"
)]
pub trait IntoVerdict {
    /// The verdict this return value stands for.
    fn into_verdict(self) -> Verdict;
}
#[diagnostic::do_not_recommend]
impl<V: Into<Verdict>> IntoVerdict for V {
    #[inline(always)]
    fn into_verdict(self) -> Verdict {
        self.into()
    }
}

/// `on_ok = path`: the classifier's verdict on the `Ok` value.
#[inline(always)]
pub fn classify_ok<T, K: OkClassifier<T>>(classifier: K, value: &T) -> Verdict {
    classifier.classify(value)
}

/// `on = all`: every failure is retried.
#[inline]
pub fn all<E>(_: &E) -> Verdict {
    Verdict::Retry
}

/// The stored form of an idempotency key: its `Display`.
#[inline]
pub fn key<K: Key + ?Sized>(key: &K) -> String {
    key.to_string()
}

/// Names the bound that `#[idempotent(key = ...)]` needs of the key, in words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an idempotency key",
    label = "`key` is stored in its `Display` form, and `{Self}` does not implement `Display`",
    note = "key by a field or a string built from the parameters (`key = order.id`, `key = format!(\"{{tenant}}:{{id}}\")`), or implement `std::fmt::Display` for `{Self}`"
)]
pub trait Key: core::fmt::Display {}
#[diagnostic::do_not_recommend]
impl<K: core::fmt::Display + ?Sized> Key for K {}

/// Names the bound that `#[idempotent(fingerprint = ...)]` needs, in words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted",
    label = "`fingerprint` is hashed from its serde JSON form, so it needs `serde::Serialize`",
    note = "fingerprint the parameters that define the request, such as `fingerprint = (amount, currency)`, and derive `serde::Serialize` for their types"
)]
pub trait Fingerprint: serde::Serialize {}
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + ?Sized> Fingerprint for T {}

/// `fingerprint = EXPR`: a SHA-256 digest of the value's JSON form, stable across processes
/// and builds.
pub fn fingerprint<T: Fingerprint + ?Sized>(value: &T) -> String {
    use sha2::{Digest, Sha256};
    let bytes =
        serde_json::to_vec(value).unwrap_or_else(|e| format!("unserializable: {e}").into_bytes());
    let digest = Sha256::digest(&bytes);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Names the bound that `#[idempotent]` needs of the `Ok` type, in words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored for replay",
    label = "`#[idempotent]` stores the `Ok` value, so it needs `serde::Serialize + serde::de::DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}
// `do_not_recommend`: a missing serde derive is one error in the words above, not one per
// serde trait in rustc's.
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

/// Names the bound that `#[step]` (and [`step`](crate::step())) need of the `Ok` type, in
/// words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be recorded as a step's value",
    label = "`#[step]` records the `Ok` value for later runs of the job, so it needs `serde::Serialize + serde::de::DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, or return what the later steps need of it"
)]
pub trait Recordable: serde::Serialize + serde::de::DeserializeOwned {}
#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Recordable for T {}

/// Names the bound that `timeout`, `budget` and `breaker` need, in words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry jobguard's own errors",
    label = "this error type needs `From<jobguard::Error>`",
    note = "`timeout`, `budget`, `breaker` and `#[idempotent]` can fail on their own (a cut attempt, a spent budget, an open breaker, an unreachable store); add a variant `#[transient(from)] Jobguard(jobguard::Error)` and `impl From<jobguard::Error> for {Self} {{ fn from(e: jobguard::Error) -> Self {{ Self::Jobguard(e) }} }}` (with thiserror, `Jobguard(#[from] jobguard::Error)` writes the `impl`)"
)]
pub trait FromJobguard: From<crate::Error> {}
impl<E: From<crate::Error>> FromJobguard for E {}

/// Names the bound that `#[retry]` (and [`Policy::run`](crate::Policy::run)) need of the
/// error type, in words: each failure's text goes into the job's dead letter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be written into a dead letter",
    label = "`#[retry]` needs the error type to implement `std::fmt::Display`",
    note = "every failure's text goes into the job's dead letter (`DeadLetter::error` and `history`); implement `std::fmt::Display` for `{Self}` (with `thiserror`: `#[error(\"...\")]` on each variant)"
)]
pub trait Describe: core::fmt::Display {}
#[diagnostic::do_not_recommend]
impl<E: core::fmt::Display + ?Sized> Describe for E {}

/// An `on_ok` classifier: `fn(&T) -> Verdict` or `fn(&T) -> bool` (`true` retries), or a
/// closure of either shape.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify the job's `Ok` value of type `{T}`",
    label = "`on_ok` needs a `fn(&{T}) -> jobguard::Verdict` or `fn(&{T}) -> bool`",
    note = "return `Verdict::Retry` (or `true`) to retry the value, `Verdict::RetryAfter(d)` to retry after `d`, and `Verdict::Fail` (or `false`) to accept it"
)]
pub trait OkClassifier<T> {
    /// What the value says about trying again.
    fn classify(self, value: &T) -> Verdict;
}

#[diagnostic::do_not_recommend]
impl<T, V: Into<Verdict>, K: FnOnce(&T) -> V> OkClassifier<T> for K {
    #[inline]
    fn classify(self, value: &T) -> Verdict {
        self(value).into()
    }
}
