//! The Redis store (feature `redis`): claims and results shared by every worker that reaches one
//! Redis server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jobguard::Error> {
//! use jobguard::store::redis::RedisStore;
//!
//! // TLS with `rediss://`, AUTH with `redis://user:password@host/`.
//! let store = RedisStore::connect("redis://127.0.0.1:6380/").await?;
//! let runtime = jobguard::Runtime::builder().store(store).build();
//! runtime.install();
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! `(scope, key)` is stored at `jobguard:{scope}:{key}`, which [`RedisStore::redis_key`] computes:
//!
//! * the scope is written as it is, except that `%` and `:` are percent-escaped (`%25`, `%3A`);
//!   the scopes jobguard produces never contain either, so they appear verbatim. The scope thus
//!   never contains `:`, and the first `:` after `jobguard:` ends it;
//! * the key is written as it is when it is at most 200 bytes of printable, non-space ASCII
//!   (`!` to `~`) and does not start with `#`. Any other key (long, with spaces, control bytes or
//!   non-ASCII text, or starting with `#`) is written `#sha256:<64 hex digits>` of its bytes.
//!
//! So no two distinct `(scope, key)` pairs share a Redis key, short of a SHA-256 collision: two
//! scopes differ in the part before the first `:`; within a scope a verbatim key never starts
//! with `#` and a hashed one always does, and distinct keys of one kind differ verbatim or by
//! digest.
//!
//! # Records
//!
//! One Redis string per key, whose expiry is the lease while claimed and the TTL once completed.
//! It starts with `jg` and the format version, then `/` and the state; its variable-length
//! fields are written `<length>:<bytes>`, and an absent fingerprint as `n`:
//!
//! | state | value |
//! |---|---|
//! | claimed | `jg1/c` token fingerprint, e.g. `jg1/c5:tok-15:fp-ab` or `jg1/c5:tok-1n` |
//! | completed | `jg1/d` fingerprint, then the result's bytes to the end, opaque to the store |
//!
//! A string rather than a hash, so that claiming a free key is a single `SET NX PX` inside the
//! script, and completing it one `GET` and one `SET PX`. A value that is anything else (another
//! type, another version, a malformed field, a claim without an expiry) makes
//! [`claim`](Store::claim) fail with [`Error::Corrupt`], counts as "not
//! held" for the token checks, and is left in place for an operator to inspect.
//!
//! # Semantics
//!
//! Every operation is one Lua script (`EVALSHA`, loading the script on `NOSCRIPT`), so one round
//! trip, and every script touches exactly one key, passed as `KEYS[1]`: the store is safe on Redis
//! Cluster.
//!
//! * [`claim`](Store::claim): a free key is claimed for the lease (`PEXPIRE`) and found
//!   [`Acquired`](Claim::Acquired); a completed one gives its record; a claimed one gives
//!   [`InProgress`](Claim::InProgress) with the lease's `PTTL`. A fingerprint mismatches only when
//!   both the stored one and the given one are present and differ, and it is checked first: a
//!   reused key is [`KeyReused`](Claim::KeyReused) whether it is claimed or completed.
//! * [`complete`](Store::complete), [`release`](Store::release), [`renew`](Store::renew): only
//!   while `token` holds the claim. Otherwise `complete` and `renew` fail with
//!   [`Error::LeaseLost`] and `release` does nothing.
//! * A server that cannot be reached gives [`Error::Store`] (so the job does
//!   not run: fail closed). The connection manager reconnects in the background, so the same
//!   store works again once the server is back.

use super::{Claim, Store, StoreFuture, StoreKey};
use crate::Error;
use crate::classify::{Transient, Verdict};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

/// The longest key stored verbatim, in bytes; longer ones are hashed.
pub const MAX_VERBATIM_KEY: usize = 200;

/// The prefix of every key the store writes.
pub const KEY_PREFIX: &str = "jobguard:";

/// An idempotency [`Store`] on Redis, through the `redis` crate's async connection manager.
///
/// `Clone` is cheap and shares the connection. See the [module docs](self) for the key scheme,
/// the record layout and the semantics.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host[:port][/db]`, or
    /// `rediss://` for TLS) with [`RedisStore::default_config`].
    ///
    /// A malformed URL or an unreachable server is [`Error::Store`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with_config(url, Self::default_config()).await
    }

    /// Connects to `url` with the given reconnection and timeout settings.
    pub async fn connect_with_config(
        url: &str,
        config: ConnectionManagerConfig,
    ) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(|e| store_error("invalid Redis URL", &e))?;
        if url.starts_with("rediss://") {
            install_crypto_provider();
        }
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| store_error("cannot connect to Redis", &e))?;
        Ok(RedisStore { connection })
    }

    /// A store on a connection manager the caller built.
    pub fn from_manager(connection: ConnectionManager) -> Self {
        RedisStore { connection }
    }

    /// The connection manager, to run other commands on the same connection.
    pub fn manager(&self) -> ConnectionManager {
        self.connection.clone()
    }

    /// The settings [`connect`](Self::connect) uses: 2 s to connect, 2 s for a reply, and one
    /// quick reconnection attempt per failed call, so that a call made while the server is down
    /// fails within a few seconds instead of waiting for it.
    pub fn default_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
    }

    /// The Redis key that holds `key`: `jobguard:{scope}:{key}`, with the escaping and hashing
    /// described in the [module docs](self#keys).
    pub fn redis_key(key: StoreKey<'_>) -> String {
        let mut out = String::with_capacity(KEY_PREFIX.len() + key.scope.len() + 1 + 72);
        out.push_str(KEY_PREFIX);
        for c in key.scope.chars() {
            match c {
                '%' => out.push_str("%25"),
                ':' => out.push_str("%3A"),
                c => out.push(c),
            }
        }
        out.push(':');
        let bytes = key.key.as_bytes();
        let verbatim = bytes.len() <= MAX_VERBATIM_KEY
            && bytes.first() != Some(&b'#')
            && bytes.iter().all(u8::is_ascii_graphic);
        if verbatim {
            out.push_str(key.key);
        } else {
            out.push_str("#sha256:");
            for b in Sha256::digest(bytes) {
                let _ = write!(out, "{b:02x}");
            }
        }
        out
    }

    async fn claim_now(
        &self,
        key: StoreKey<'_>,
        token: &str,
        fingerprint: Option<&str>,
        lease: Duration,
    ) -> Result<Claim, Error> {
        let fingerprint = Field(fingerprint);
        let reply: Value = CLAIM
            .key(Self::redis_key(key))
            .arg(format!("{CLAIMED}{}{fingerprint}", Field(Some(token))))
            .arg(fingerprint.to_string())
            .arg(millis(lease))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| store_error("claim failed", &e))?;
        decode_claim(reply)
    }

    /// Runs a token-checked script; `Ok(true)` when `token` held the claim.
    async fn if_held(
        &self,
        script: &Script,
        key: StoreKey<'_>,
        token: &str,
        args: &[&[u8]],
        what: &str,
    ) -> Result<bool, Error> {
        let mut call = script.key(Self::redis_key(key));
        call.arg(format!("{CLAIMED}{}", Field(Some(token))));
        for a in args {
            call.arg(*a);
        }
        let held: i64 = call
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| store_error(what, &e))?;
        Ok(held == 1)
    }
}

/// The start of a claimed record; a claim's token follows it.
const CLAIMED: &str = "jg1/c";

/// A variable-length field of a record: `<length>:<bytes>`, or `n` for none. The encoding is
/// prefix-free, so a record starts with `jg1/c` and a token's field exactly when it is that
/// token's claim.
#[derive(Clone, Copy)]
struct Field<'a>(Option<&'a str>);

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(s) => write!(f, "{}:{s}", s.len()),
            None => f.write_str("n"),
        }
    }
}

/// Lease and TTL in milliseconds for `PEXPIRE`: at least 1, and small enough that Redis accepts it.
fn millis(d: Duration) -> u64 {
    (d.as_millis().min(1 << 53) as u64).max(1)
}

fn store_error(what: &str, e: &redis::RedisError) -> Error {
    Error::Store(format!("{what}: {e}"))
}

fn decode_claim(reply: Value) -> Result<Claim, Error> {
    let unexpected = |r: &Value| Error::Store(format!("unexpected reply to claim: {r:?}"));
    let Value::Array(items) = &reply else {
        return Err(unexpected(&reply));
    };
    match items.as_slice() {
        [Value::Int(0)] => Ok(Claim::Acquired),
        [Value::Int(1), Value::BulkString(record)] => Ok(Claim::Completed(record.clone())),
        [Value::Int(2), Value::Int(ms)] => Ok(Claim::InProgress {
            retry_in: Duration::from_millis((*ms).max(0) as u64),
        }),
        [Value::Int(3)] => Ok(Claim::KeyReused),
        [Value::Int(4), why] => Err(Error::Corrupt(match why {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => format!("{other:?}"),
        })),
        _ => Err(unexpected(&reply)),
    }
}

/// Installs rustls' `ring` provider as the process default unless one is installed already, so
/// that the TLS handshake finds a provider whatever else the build enabled. The one installer:
/// the Redis dead-letter sink calls it too.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

// Reads the field at `i` of `v` (see `Field`): the field as written and the index after it, or
// nil when it is malformed.
const FIELD: &str = r#"
local function field(v, i)
  if string.sub(v, i, i) == 'n' then return 'n', i + 1 end
  local s, e, len = string.find(v, '^(%d+):', i)
  if not s then return nil end
  local after = e + 1 + tonumber(len)
  if after > #v + 1 then return nil end
  return string.sub(v, i, after - 1), after
end
"#;

// KEYS[1]: the record. ARGV: the claimed record to write, the fingerprint field, lease in ms.
// Returns {0} acquired, {1, result} completed, {2, pttl} in progress, {3} reused, {4, why} corrupt.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then return {0} end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return {4, 'not a jobguard record: ' .. (type(v) == 'table' and v['err'] or 'missing')}
end
local version = string.match(v, '^jg(%d+)/')
if not version then return {4, 'not a jobguard record'} end
if version ~= '1' then return {4, 'record format version ' .. version .. ' (this build reads 1)'} end
local state = string.sub(v, 5, 5)
local i, fp = 6, nil
if state == 'c' then
  local token
  token, i = field(v, i)
  if not token or token == 'n' then return {4, 'a claim without a token'} end
end
if state == 'c' or state == 'd' then
  fp, i = field(v, i)
  if not fp then return {4, 'a malformed fingerprint'} end
else
  return {4, 'unknown record state ' .. state}
end
if fp ~= 'n' and ARGV[2] ~= 'n' and fp ~= ARGV[2] then return {3} end
if state == 'd' then return {1, string.sub(v, i)} end
if i ~= #v + 1 then return {4, 'trailing bytes after a claim'} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then return {4, 'a claim without an expiry'} end
return {2, ttl}
"#
    ))
});

// The check shared by the token scripts: ARGV[1] is `jg1/c` and the token's field; does the
// record start with it (the token holds the claim)?
macro_rules! held {
    ($body:literal) => {
        concat!(
            r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
"#,
            $body
        )
    };
}

// ARGV: claim prefix, result, ttl in ms. Keeps the fingerprint with the result.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
local i = #ARGV[1] + 1
local fp, after = field(v, i)
if not fp or after ~= #v + 1 then return 0 end
redis.call('SET', KEYS[1], 'jg1/d' .. fp .. ARGV[2], 'PX', ARGV[3])
return 1
"#
        )
    ))
});

// ARGV: claim prefix.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(held!(
        r#"
redis.call('DEL', KEYS[1])
return 1
"#
    ))
});

// ARGV: claim prefix, lease in ms.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(held!(
        r#"
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#
    ))
});

impl Store for RedisStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        Box::pin(self.claim_now(key, token, fingerprint, lease))
    }

    fn complete<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        record: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ttl = millis(ttl).to_string();
            let args: [&[u8]; 2] = [record, ttl.as_bytes()];
            match self
                .if_held(&COMPLETE, key, token, &args, "complete failed")
                .await?
            {
                true => Ok(()),
                false => Err(Error::LeaseLost),
            }
        })
    }

    fn release<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.if_held(&RELEASE, key, token, &[], "release failed")
                .await
                .map(drop)
        })
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let lease = millis(lease).to_string();
            match self
                .if_held(&RENEW, key, token, &[lease.as_bytes()], "renew failed")
                .await?
            {
                true => Ok(()),
                false => Err(Error::LeaseLost),
            }
        })
    }
}

impl Transient for redis::RedisError {
    /// Connection losses, timeouts, `BUSY`, `LOADING`, `TRYAGAIN` and cluster redirects are
    /// transient; what the client classes as not worth retrying (a wrong type, a script error,
    /// bad configuration, a permission error) is permanent.
    fn verdict(&self) -> Verdict {
        match self.retry_method() {
            redis::RetryMethod::NoRetry => Verdict::Fail,
            _ => Verdict::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rk(scope: &str, key: &str) -> String {
        RedisStore::redis_key(StoreKey { scope, key })
    }

    #[test]
    fn plain_keys_are_verbatim() {
        assert_eq!(
            rk("payments.charge", "idem-1"),
            "jobguard:payments.charge:idem-1"
        );
        assert_eq!(rk("s", "tenant:42:order"), "jobguard:s:tenant:42:order");
        assert_eq!(
            rk("s", &"k".repeat(200)),
            format!("jobguard:s:{}", "k".repeat(200))
        );
    }

    #[test]
    fn other_keys_are_hashed() {
        let hashed = |k: &str| rk("s", k).starts_with("jobguard:s:#sha256:");
        assert!(hashed(&"k".repeat(201)));
        assert!(hashed("has space"));
        assert!(hashed("tab\t"));
        assert!(hashed("nul\0"));
        assert!(hashed("café"));
        assert!(hashed("#leading-hash"));
        assert!(
            !hashed(""),
            "the empty key is verbatim: nothing else maps to it"
        );
        assert_eq!(
            rk("s", " "),
            "jobguard:s:#sha256:36a9e7f1c95b82ffb99743e0c5c4ce95d83c9a430aac59f84ef3cbfab6145068"
        );
    }

    #[test]
    fn scopes_are_escaped_so_they_never_contain_a_colon() {
        assert_eq!(rk("a:b", "c"), "jobguard:a%3Ab:c");
        assert_eq!(rk("a%3Ab", "c"), "jobguard:a%253Ab:c");
        assert_ne!(rk("a:b", "c"), rk("a", "b:c"));
    }

    #[test]
    fn fields_are_length_prefixed_so_no_token_is_a_prefix_of_another() {
        assert_eq!(Field(Some("tok")).to_string(), "3:tok");
        assert_eq!(Field(Some("")).to_string(), "0:");
        assert_eq!(Field(None).to_string(), "n");
        let claim = |t: &str| format!("{CLAIMED}{}n", Field(Some(t)));
        let prefix = |t: &str| format!("{CLAIMED}{}", Field(Some(t)));
        for (a, b) in [
            ("t", "t1"),
            ("t1", "t"),
            ("", "x"),
            ("1:x", "1"),
            ("ab", "a"),
        ] {
            assert!(!claim(a).starts_with(&prefix(b)), "{a:?} held by {b:?}");
        }
        assert!(claim("t1").starts_with(&prefix("t1")));
    }

    #[test]
    fn connection_losses_are_transient_and_client_errors_permanent() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(refused.verdict(), Verdict::Retry);
        let misuse = redis::RedisError::from((redis::ErrorKind::Client, "bad argument"));
        assert_eq!(misuse.verdict(), Verdict::Fail);
    }

    #[test]
    fn millis_is_clamped() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(300)), 300);
        assert_eq!(millis(Duration::MAX), 1 << 53);
    }

    #[test]
    fn claim_replies_decode() {
        use Value::*;
        assert_eq!(decode_claim(Array(vec![Int(0)])), Ok(Claim::Acquired));
        assert_eq!(
            decode_claim(Array(vec![Int(1), BulkString(b"{}".to_vec())])),
            Ok(Claim::Completed(b"{}".to_vec()))
        );
        assert_eq!(
            decode_claim(Array(vec![Int(2), Int(250)])),
            Ok(Claim::InProgress {
                retry_in: Duration::from_millis(250)
            })
        );
        assert_eq!(decode_claim(Array(vec![Int(3)])), Ok(Claim::KeyReused));
        assert_eq!(
            decode_claim(Array(vec![Int(4), BulkString(b"bad".to_vec())])),
            Err(Error::Corrupt("bad".into()))
        );
        assert!(matches!(decode_claim(Int(7)), Err(Error::Store(_))));
        assert!(matches!(
            decode_claim(Array(vec![Int(9)])),
            Err(Error::Store(_))
        ));
    }
}
