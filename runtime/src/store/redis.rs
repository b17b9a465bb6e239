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
//! One Redis hash per key, whose expiry is the lease while claimed and the TTL once completed:
//!
//! | field | value |
//! |---|---|
//! | `v` | the format version, `1` |
//! | `s` | `c` while claimed, `d` once completed |
//! | `t` | the claim's token (claimed only) |
//! | `f` | the fingerprint, when the claim gave one |
//! | `r` | the completed result's bytes, opaque to the store (completed only) |
//!
//! A key that holds anything else (another type, another version, a hash without these fields, a
//! claim without an expiry) makes [`claim`](Store::claim) fail with
//! [`Error::Corrupt`](crate::Error::Corrupt), and counts as "not held" for the token checks.
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
//!   [`Error::LeaseLost`](crate::Error::LeaseLost) and `release` does nothing.
//! * A server that cannot be reached gives [`Error::Store`](crate::Error::Store) (so the job does
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
        let reply: Value = CLAIM
            .key(Self::redis_key(key))
            .arg(token)
            .arg(if fingerprint.is_some() { "1" } else { "0" })
            .arg(fingerprint.unwrap_or(""))
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
        call.arg(token);
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
/// that the TLS handshake finds a provider whatever else the build enabled.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

// KEYS[1]: the record. ARGV: token, has fingerprint ('1' | '0'), fingerprint, lease in ms.
// Returns {0} acquired, {1, record} completed, {2, pttl} in progress, {3} reused, {4, why} corrupt.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local r = redis.pcall('HMGET', KEYS[1], 'v', 's', 't', 'f', 'r')
if r['err'] then return {4, r['err']} end
local v, s, f = r[1], r[2], r[4]
if not (v or s or r[3] or f or r[5]) then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {4, 'a hash without jobguard fields'} end
  if ARGV[2] == '1' then
    redis.call('HSET', KEYS[1], 'v', '1', 's', 'c', 't', ARGV[1], 'f', ARGV[3])
  else
    redis.call('HSET', KEYS[1], 'v', '1', 's', 'c', 't', ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {0}
end
if v ~= '1' then return {4, 'record format version ' .. (v or 'missing') .. ' (this build reads 1)'} end
if ARGV[2] == '1' and f and f ~= ARGV[3] then return {3} end
if s == 'd' then
  if not r[5] then return {4, 'a completed record without a result'} end
  return {1, r[5]}
end
if s == 'c' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then return {4, 'a claim without an expiry'} end
  return {2, ttl}
end
return {4, 'unknown record state ' .. (s or 'missing')}
"#,
    )
});

// The check shared by the token scripts: does ARGV[1] hold a live claim on KEYS[1]?
macro_rules! held {
    ($body:literal) => {
        concat!(
            r#"
local r = redis.pcall('HMGET', KEYS[1], 'v', 's', 't')
if r['err'] or r[1] ~= '1' or r[2] ~= 'c' or r[3] ~= ARGV[1] then return 0 end
"#,
            $body
        )
    };
}

// ARGV: token, record, ttl in ms.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(held!(
        r#"
redis.call('HSET', KEYS[1], 's', 'd', 'r', ARGV[2])
redis.call('HDEL', KEYS[1], 't')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#
    ))
});

// ARGV: token.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(held!(
        r#"
redis.call('DEL', KEYS[1])
return 1
"#
    ))
});

// ARGV: token, lease in ms.
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
