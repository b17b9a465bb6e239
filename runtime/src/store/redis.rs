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
//! let _ = runtime.install(); // the first install wins; a second hands its runtime back
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
//! One Redis string per key. It starts with `jg` and the version of its state's layout, then
//! `/` and the state; its variable-length fields are written `<length>:<bytes>`, and an absent
//! fingerprint as `n`; numbers are decimal, and times are milliseconds of the server's clock
//! (`TIME`, read inside the script):
//!
//! | state | value | the key's expiry |
//! |---|---|---|
//! | claimed | `jg2/c` token fingerprint `generation:crashes:lease_end`, e.g. `jg2/c5:tok-15:fp-ab3:1:1733250000123` | the TTL (or the lease, if longer) from the claim; a renew extends it to the lease when it would end sooner |
//! | completed | `jg1/d` fingerprint, then the result's bytes to the end, opaque to the store | the TTL from the completion |
//! | released | `jg2/f` `generation:crashes` | the claim's, kept |
//! | poisoned | `jg2/p` `generation:crashes` | the TTL from the claim that poisoned it |
//!
//! A claim no longer expires with its lease: a claim whose lease ended is still there for the
//! next claim to find, take over and count as a crash (see [`Claimed`]). A released key keeps its
//! generation and crash count, so generations only grow and a job that crashes, is released by a
//! later run that fails, and crashes again is still counted.
//!
//! ## Versions
//!
//! The version is that of the state's layout. Completed records are unchanged since version 1
//! and are still written `jg1/d`. Version 2 gave claims their generation, crash count and lease
//! end, and added the released and poisoned states. This build reads both versions:
//!
//! * a version-1 claim (`jg1/c` token fingerprint), written by a build before this one, expires
//!   with its lease, so while it exists it is live: it is
//!   [`InProgress`](Claimed::InProgress) with its `PTTL`, and once it has expired the key is
//!   free (that claim's crash, if it was one, is not counted);
//! * a build before this one reads the version-1 completed records this one writes (a replay
//!   works across a rolling upgrade), and fails closed with [`Error::Corrupt`] on a version-2
//!   claim, released or poisoned key: its job does not run while a new worker holds the key,
//!   and an old worker keeps failing on a released or poisoned key until the upgrade is done.
//!
//! A string rather than a hash, so that completing a claim is one `GET` and one `SET PX` inside
//! the script. A value that is anything else (another type, another version, a malformed field,
//! a version-1 claim without an expiry) makes [`claim`](Store::claim) fail with
//! [`Error::Corrupt`], counts as "not held" for the token checks, and is left in place for an
//! operator to inspect.
//!
//! # Semantics
//!
//! Every operation is one Lua script (`EVALSHA`, loading the script on `NOSCRIPT`), so one round
//! trip, and every script touches exactly one key, passed as `KEYS[1]`: on a Redis Cluster each
//! script runs whole on the master of its key's slot (see [below](self#redis-cluster)).
//!
//! * [`claim`](Store::claim): a free key (absent, or released) is claimed for the lease
//!   and found [`Acquired`](Claimed::Acquired), with generation 1 for an absent key and one more
//!   than the record's for a released one; a completed one gives its record; a live claim gives
//!   [`InProgress`](Claimed::InProgress) with the time left on its lease. A claim whose lease
//!   ended is taken over: one more generation and one more crash, unless that crash reaches the
//!   crash limit, and then the key is poisoned for the TTL ([`Poisoned`](Claimed::Poisoned),
//!   with the letter role for that claim; `jg2/q`). A fingerprint mismatches only when both the
//!   stored one and the given one are present and differ, and it is checked first on a
//!   completed record or a live claim: a reused key is [`KeyReused`](Claimed::KeyReused).
//! * [`lettered`](Store::lettered): a poisoned key's letter is confirmed (`jg2/q` becomes
//!   `jg2/p`, its expiry kept); until then the letter role is handed out again, one claimer at
//!   a time, each for its lease.
//! * [`complete`](Store::complete), [`release`](Store::release), [`renew`](Store::renew): only
//!   while `token` holds a claim whose lease has not ended. Otherwise `complete` and `renew` fail
//!   with [`Error::LeaseLost`] and `release` does nothing.
//! * [`forgive`](Store::forgive): one script, like the others: a poisoned key (`jg2/p`, `jg2/q`) or a
//!   claim whose lease ended becomes a released key (`jg2/f`) with its generation and a crash
//!   count of 0, keeping the key's expiry; a released key's count goes back to 0. A completed
//!   record, a live claim (a version-1 claim is live while it exists) and an absent key are left
//!   alone, and a value this build cannot read is [`Error::Corrupt`], left in place. (A
//!   poisoned key whose letter is not confirmed, `jg2/q`, is forgiven the same way.)
//! * Leases are measured on the server's clock, so workers' clocks need not agree.
//! * A server that cannot be reached gives [`Error::Store`] (so the job does
//!   not run: fail closed). The connection manager reconnects in the background, so the same
//!   store works again once the server is back.
//!
//! # Redis Cluster
//!
//! [`RedisStore::connect_cluster`] takes seed nodes and uses the `redis` crate's cluster
//! connection, with the same scripts, records, semantics and errors:
//!
//! ```no_run
//! # async fn demo() -> Result<(), jobguard::Error> {
//! use jobguard::store::redis::RedisStore;
//!
//! let nodes = ["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"];
//! let store = RedisStore::connect_cluster(&nodes).await?;
//! # drop(store);
//! # Ok(()) }
//! ```
//!
//! * No hash tag is added to the keys: each key hashes to its own slot, so keys spread over the
//!   slots and the masters, and each claim is atomic on the master that holds its key. (A `{...}`
//!   that a scope or a key itself contains acts as a hash tag, as Redis defines it.)
//! * `MOVED` and `ASK` during a slot migration are followed by the connection, and a script that
//!   the new node lacks is loaded on `NOSCRIPT`: callers see nothing of a resharding.
//! * While a master is down, calls on its slots fail closed with [`Error::Store`] after a few
//!   quick retries (and once the other nodes mark it failed, the whole cluster refuses commands
//!   until its replica is promoted, unless `cluster-require-full-coverage` is `no`). After the
//!   promotion the connection finds the new master, and the same store works again.
//! * Replication is asynchronous, as everywhere in Redis: a claim or a result that a master
//!   acknowledged in the instant before it died may not have reached its replica, and is then
//!   lost in the failover (so that key can run again).
//! # `maxmemory`
//!
//! A Redis server with a `maxmemory` limit evicts keys by its `maxmemory-policy` when it reaches
//! the limit. A claim evicted while its job runs lets a redelivery run the job a second time;
//! a completed record evicted before its TTL lets a redelivery run it again too. Every key this
//! store writes carries an expiry (the lease, then the TTL), so:
//!
//! | policy | what it does to jobguard's keys |
//! |---|---|
//! | `noeviction` | **safe**: nothing is evicted; at the limit, writes fail, so a new claim fails closed with [`Error::Store`] and the job does not run. Replays keep working. |
//! | no `maxmemory` (`0`, the default) | **safe**: nothing is evicted; the server grows. |
//! | `volatile-ttl` | **not safe**: it evicts the keys nearest their expiry first, claims and completed records alike. |
//! | `volatile-lru`, `volatile-lfu`, `volatile-random` | **not safe**: any key with an expiry, which is every jobguard key. |
//! | `allkeys-lru`, `allkeys-lfu`, `allkeys-random` | **not safe**: any key at all. |
//!
//! So give the store a server (not only a database: the limit and the policy are per server)
//! with `maxmemory-policy noeviction`, sized for the jobs of one TTL, and keep caches elsewhere.
//! [`RedisStore::connect`] asks the server (`CONFIG GET maxmemory*`) and logs a warning, once
//! per process, when its settings can evict claims; it stays quiet when `CONFIG` is disabled.

use super::{
    ClaimOptions, Claimed, KeyInfo, KeyState, Letter, StepKey, StepRecord, Store, StoreFuture,
    StoreKey,
};
use crate::Error;
use crate::classify::{Transient, Verdict};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Logs a warning, once per process, when the server may evict keys to stay under `maxmemory`
/// (see [`eviction_risk`]). Says nothing when it cannot tell: `CONFIG` is often disabled or
/// renamed on managed servers.
async fn warn_if_claims_can_be_evicted(connection: &mut RedisConnection) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.load(Ordering::Relaxed) {
        return;
    }
    let config: Result<HashMap<String, String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory*")
        .query_async(connection)
        .await;
    let Ok(config) = config else { return };
    let maxmemory = config.get("maxmemory").map_or("0", String::as_str);
    let policy = config.get("maxmemory-policy").map_or("", String::as_str);
    if let Some(risk) = eviction_risk(maxmemory, policy)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        crate::observe::log_warn(format_args!(
            "jobguard: this Redis server has maxmemory {maxmemory} and maxmemory-policy {policy}: \
             {risk}. A claim evicted while its job runs lets a redelivery run the job again; \
             give jobguard a server of its own with maxmemory-policy noeviction, where \
             a full server refuses new claims instead"
        ));
    }
}

/// What the server's eviction settings can do to jobguard's keys, or `None` when they cannot
/// evict them: no `maxmemory` (`0`), or `noeviction`. Every key jobguard writes has an expiry,
/// so the `volatile-*` policies can pick them as well as the `allkeys-*` ones; `volatile-ttl`
/// picks the keys nearest their expiry first, claims as readily as completed records.
pub(crate) fn eviction_risk(maxmemory: &str, policy: &str) -> Option<&'static str> {
    if maxmemory.trim() == "0" || policy == "noeviction" {
        return None;
    }
    Some(match policy {
        p if p.starts_with("allkeys-") => "it may evict any key, live claims included",
        "volatile-ttl" => {
            "it evicts the keys nearest their expiry first, live claims as readily as \
             completed records"
        }
        p if p.starts_with("volatile-") => {
            "it may evict any key with an expiry, and every jobguard key has one"
        }
        _ => "it may evict keys",
    })
}

/// The longest key stored verbatim, in bytes; longer ones are hashed.
pub const MAX_VERBATIM_KEY: usize = 200;

/// The prefix of every key that holds a record ([`RedisStore::redis_key`]).
pub const KEY_PREFIX: &str = "jobguard:";

/// The prefix of every key that holds a job's durable steps and count of attempts
/// ([`RedisStore::steps_key`]). Under [`KEY_PREFIX`], so that an ACL limited to `~jobguard:*`
/// covers it, and never a record's key: a record's scope holds `%` only as `%25` or `%3A`.
pub const STEPS_PREFIX: &str = "jobguard:%steps:";

/// An idempotency [`Store`] on Redis: one server through the `redis` crate's connection manager,
/// or a Redis Cluster through its cluster connection.
///
/// `Clone` is cheap and shares the connection. See the [module docs](self) for the key scheme,
/// the record layout and the semantics.
#[derive(Clone)]
pub struct RedisStore {
    connection: RedisConnection,
    /// Where a [shared](crate::fleet) breaker or budget subscribes to the fleet's news: the
    /// server, or a cluster's seed nodes (tried in turn). Empty for a store made from a
    /// connection, which knows no address.
    subscribe: Vec<redis::Client>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "cluster",
                &matches!(self.connection, RedisConnection::Cluster(_)),
            )
            .finish_non_exhaustive()
    }
}

/// The connection a [`RedisStore`] or a
/// [`RedisDeadLetters`](crate::dead_letter::redis::RedisDeadLetters) sends its commands on: one
/// server or a cluster. `Clone` shares it.
///
/// It implements the `redis` crate's [`ConnectionLike`], so other commands run on it too:
/// `redis::cmd("PING").query_async(&mut store.connection())`. On a cluster, a command is routed
/// by its key, and `MOVED`/`ASK` redirections are followed.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server, through a connection manager that reconnects in the background.
    Single(ConnectionManager),
    /// A Redis Cluster, through the cluster connection, which routes each command to the node
    /// that holds its key's slot, follows redirections and reconnects to lost nodes.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConnection::Single(_) => "RedisConnection::Single",
            RedisConnection::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(connection: ConnectionManager) -> Self {
        RedisConnection::Single(connection)
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(connection: ClusterConnection) -> Self {
        RedisConnection::Cluster(connection)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisConnection {
    /// Connects to the server at `url` with `config`; see [`RedisStore::connect_with_config`].
    pub async fn connect(url: &str, config: ConnectionManagerConfig) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(|e| store_error("invalid Redis URL", &e))?;
        if url.starts_with("rediss://") {
            install_crypto_provider();
        }
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| store_error("cannot connect to Redis", &e))?;
        Ok(RedisConnection::Single(connection))
    }

    /// Connects to the cluster that `builder` names; see [`RedisStore::connect_cluster_with`].
    pub async fn connect_cluster(builder: ClusterClientBuilder) -> Result<Self, Error> {
        // The seed nodes' URLs are parsed by `build`; TLS needs a crypto provider whatever they
        // say, and installing one that goes unused costs nothing.
        install_crypto_provider();
        let client = builder
            .build()
            .map_err(|e| store_error("invalid Redis Cluster nodes", &e))?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| store_error("cannot connect to Redis Cluster", &e))?;
        Ok(RedisConnection::Cluster(connection))
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
        let mut connection = RedisConnection::connect(url, config).await?;
        warn_if_claims_can_be_evicted(&mut connection).await;
        let client = redis::Client::open(url).map_err(|e| store_error("invalid Redis URL", &e))?;
        Ok(RedisStore {
            connection,
            subscribe: vec![client],
        })
    }

    /// Connects to a Redis Cluster through its seed `nodes` (a `&[&str]`, a `Vec<String>`...:
    /// `redis://[user:password@]host:port/`, or `rediss://` for TLS; one reachable node is
    /// enough, the others are found from it), with [`RedisStore::cluster_builder`]'s settings.
    ///
    /// Every script touches one key, so claims stay atomic per key on a cluster, and keys spread
    /// over the slots (no hash tag piles them into one). A master that cannot be reached fails
    /// the calls on its slots with [`Error::Store`] until its replica is promoted; the
    /// connection then finds the new master, and the same store works again. See the
    /// [module docs](self#redis-cluster).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), jobguard::Error> {
    /// use jobguard::RedisStore;
    ///
    /// let store = RedisStore::connect_cluster(&[
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    ///     "redis://10.0.0.3:7000/",
    /// ])
    /// .await?;
    /// let _ = jobguard::Runtime::builder().store(store).build().install();
    /// # Ok(()) }
    /// ```
    ///
    /// No seed node, a malformed URL, or no reachable node is [`Error::Store`].
    pub async fn connect_cluster<I>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        Self::connect_cluster_with(Self::cluster_builder(&nodes))
            .await?
            .subscribing_through(&nodes)
    }

    /// Connects to the cluster that `builder` names, with its settings; start from
    /// [`RedisStore::cluster_builder`] to keep the defaults you do not change.
    pub async fn connect_cluster_with(builder: ClusterClientBuilder) -> Result<Self, Error> {
        let mut connection = RedisConnection::connect_cluster(builder).await?;
        warn_if_claims_can_be_evicted(&mut connection).await;
        Ok(RedisStore {
            connection,
            subscribe: Vec::new(),
        })
    }

    /// The store, with `nodes` (one server's URL, or a cluster's seed nodes) as where a
    /// [shared](crate::fleet) breaker or retry budget subscribes to the fleet's news. Stores
    /// from [`connect`](Self::connect) and [`connect_cluster`](Self::connect_cluster) know
    /// their nodes already; one made from a connection or a cluster builder needs this before
    /// it can share.
    ///
    /// A malformed URL is [`Error::Store`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), jobguard::Error> {
    /// use jobguard::RedisStore;
    ///
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let store = RedisStore::connect_cluster_with(RedisStore::cluster_builder(&nodes))
    ///     .await?
    ///     .subscribing_through(&nodes)?;
    /// # drop(store);
    /// # Ok(()) }
    /// ```
    pub fn subscribing_through<I>(mut self, nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.subscribe = nodes
            .into_iter()
            .map(|url| {
                redis::Client::open(url.as_ref()).map_err(|e| store_error("invalid Redis URL", &e))
            })
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Where a shared breaker or budget subscribes: see [`subscribing_through`](Self::subscribing_through).
    pub(crate) fn subscribers(&self) -> &[redis::Client] {
        &self.subscribe
    }

    /// A cluster client builder on the seed `nodes` with the settings
    /// [`connect_cluster`](Self::connect_cluster) uses, the cluster's counterpart of
    /// [`default_config`](Self::default_config): 2 s to connect to a node, 2 s for a reply
    /// including the redirections and retries, and up to 5 retries 10 ms to 1 s apart, so a
    /// call made while a master is down fails within a few seconds instead of waiting for the
    /// failover.
    pub fn cluster_builder<I>(nodes: I) -> ClusterClientBuilder
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .retries(5)
            .min_retry_wait(10)
            .max_retry_wait(1000)
    }

    /// A store on a connection manager the caller built.
    pub fn from_manager(connection: ConnectionManager) -> Self {
        RedisStore {
            connection: RedisConnection::Single(connection),
            subscribe: Vec::new(),
        }
    }

    /// A store on a connection the caller built: a [`ConnectionManager`] or a
    /// [`ClusterConnection`].
    pub fn from_connection(connection: impl Into<RedisConnection>) -> Self {
        RedisStore {
            connection: connection.into(),
            subscribe: Vec::new(),
        }
    }

    /// The connection manager, to run other commands on the same connection; `None` on a
    /// cluster (use [`connection`](Self::connection), which works on both).
    pub fn manager(&self) -> Option<ConnectionManager> {
        match &self.connection {
            RedisConnection::Single(c) => Some(c.clone()),
            RedisConnection::Cluster(_) => None,
        }
    }

    /// The connection, to run other commands on it or to share it with
    /// [`RedisDeadLetters::new`](crate::dead_letter::redis::RedisDeadLetters::new).
    pub fn connection(&self) -> RedisConnection {
        self.connection.clone()
    }

    /// `true` when the store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, RedisConnection::Cluster(_))
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

    /// The Redis key that holds the durable steps of the job whose record is at `record` (a
    /// [`redis_key`](Self::redis_key)): `jobguard:%steps:{<slot>}:<record>`, where `<slot>` is
    /// what Redis Cluster hashes of `record` (its hash tag, the text between its first `{` and
    /// the first `}` after it, when that is not empty; else the whole key), so that a job's
    /// steps are in its record's slot and one script reads or writes both. `None` for a record
    /// key without a hash tag that holds a `}`, which no hash tag can put in its slot: such a
    /// job keeps no steps (its steps fail with [`Error::Config`] before they run).
    ///
    /// ```
    /// use jobguard::store::redis::RedisStore;
    ///
    /// assert_eq!(
    ///     RedisStore::steps_key("jobguard:shop.checkout:order-7").as_deref(),
    ///     Some("jobguard:%steps:{jobguard:shop.checkout:order-7}:jobguard:shop.checkout:order-7")
    /// );
    /// assert_eq!(
    ///     RedisStore::steps_key("jobguard:s:{tenant-1}:order-7").as_deref(),
    ///     Some("jobguard:%steps:{tenant-1}:jobguard:s:{tenant-1}:order-7")
    /// );
    /// assert_eq!(RedisStore::steps_key("jobguard:s:a}b"), None);
    /// ```
    pub fn steps_key(record: &str) -> Option<String> {
        let slot = match hash_tag(record) {
            Some(tag) => tag,
            None if !record.contains('}') => record,
            None => return None,
        };
        Some(format!("{STEPS_PREFIX}{{{slot}}}:{record}"))
    }

    /// A script's invocation on `key`'s record, and on its steps when it has a steps key; and
    /// whether it has one.
    fn invocation<'s>(
        script: &'s Script,
        key: StoreKey<'_>,
    ) -> (redis::ScriptInvocation<'s>, bool) {
        let record = Self::redis_key(key);
        let steps = Self::steps_key(&record);
        let keeps_steps = steps.is_some();
        let mut call = script.key(record);
        if let Some(steps) = steps {
            call.key(steps);
        }
        (call, keeps_steps)
    }

    async fn claim_counted(
        &self,
        key: StoreKey<'_>,
        token: &str,
        options: ClaimOptions<'_>,
    ) -> Result<Claimed, Error> {
        let (mut call, keeps_steps) = Self::invocation(&CLAIM, key);
        call.arg(Field(Some(token)).to_string())
            .arg(Field(options.fingerprint).to_string())
            .arg(millis(options.lease))
            .arg(millis(options.ttl))
            .arg(options.crashes)
            .arg(millis(options.ttl.max(options.lease)));
        let reply: Value = self
            .invoke(&call)
            .await
            .map_err(|e| store_error("claim failed", &e))?;
        decode_claim(reply, keeps_steps)
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
        let (call, _) = Self::invocation(script, key);
        self.held(call, token, args, what).await
    }

    /// Runs `call`, a script that acts while `token` holds the claim, with `args` after the
    /// token: whether it held.
    async fn held(
        &self,
        mut call: redis::ScriptInvocation<'_>,
        token: &str,
        args: &[&[u8]],
        what: &str,
    ) -> Result<bool, Error> {
        call.arg(format!("{CLAIMED}{}", Field(Some(token))));
        for a in args {
            call.arg(*a);
        }
        let held: i64 = self
            .invoke(&call)
            .await
            .map_err(|e| store_error(what, &e))?;
        Ok(held == 1)
    }

    /// Runs one script. On a cluster, a redirection that the connection gave up following
    /// (`MOVED`, `ASK` or `TRYAGAIN` still coming back after its own retries, as can happen
    /// while slots migrate under load) is tried again a few times: the node that answered with
    /// it did not run the script, so running it again is safe.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        const TRIES: u32 = 8;
        let mut tried = 1;
        loop {
            match call.invoke_async(&mut self.connection.clone()).await {
                Err(e) if tried < TRIES && is_redirection(&e) => {
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(tried))).await;
                    tried += 1;
                }
                done => return done,
            }
        }
    }
}

/// What Redis Cluster hashes of `key` when it has a hash tag: the text between its first `{` and
/// the first `}` after it, when that is not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// A cluster's answer that the command belongs elsewhere or must wait for a migration: the
/// node did not run it.
fn is_redirection(error: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::TryAgain
        )
    )
}

/// The start of a claimed record; a claim's token follows it.
const CLAIMED: &str = "jg2/c";

/// A variable-length field of a record: `<length>:<bytes>`, or `n` for none. The encoding is
/// prefix-free, so a record starts with `jg2/c` and a token's field exactly when it is that
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

/// Lease and TTL in milliseconds for `PX`: at least 1, and small enough that Redis accepts it.
fn millis(d: Duration) -> u64 {
    (d.as_millis().min(1 << 53) as u64).max(1)
}

fn store_error(what: &str, e: &redis::RedisError) -> Error {
    Error::Store(format!("{what}: {e}"))
}

/// A script's `{4, why}`: a record this build cannot read, in the script's words.
fn corrupt(why: &Value) -> Error {
    Error::Corrupt(match why {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    })
}

/// The claim script's reply. `keeps_steps`: whether the key has a steps hash (see
/// [`RedisStore::steps_key`]); without one, an acquired claim has no steps and no count of
/// attempts.
fn decode_claim(reply: Value, keeps_steps: bool) -> Result<Claimed, Error> {
    let Value::Array(items) = &reply else {
        return Err(unexpected_claim_reply(&reply));
    };
    let acquired = |generation: &i64, crashes: &i64, attempts, steps| Claimed::Acquired {
        generation: u64::try_from(*generation).unwrap_or(0),
        crashes: count(crashes),
        attempts,
        steps,
    };
    match items.as_slice() {
        // A fresh key: its first attempt, no steps.
        [Value::Int(0), Value::Int(g), Value::Int(c)] if keeps_steps => {
            Ok(acquired(g, c, 1, Some(Vec::new())))
        }
        [Value::Int(0), Value::Int(g), Value::Int(c)] => Ok(acquired(g, c, 0, None)),
        [
            Value::Int(0),
            Value::Int(g),
            Value::Int(c),
            Value::Int(a),
            steps,
        ] => Ok(acquired(g, c, count(a), Some(decode_steps(steps)?))),
        _ => decode_refusal(&reply, items),
    }
}

/// The claim script's reply when the claim was not acquired.
fn decode_refusal(reply: &Value, items: &[Value]) -> Result<Claimed, Error> {
    match items {
        [Value::Int(1), Value::BulkString(record)] => Ok(Claimed::Completed(record.clone())),
        [Value::Int(2), Value::Int(ms)] => Ok(Claimed::InProgress {
            retry_in: Duration::from_millis((*ms).max(0) as u64),
        }),
        [Value::Int(3)] => Ok(Claimed::KeyReused),
        [Value::Int(4), why] => Err(corrupt(why)),
        [
            Value::Int(5),
            Value::Int(crashes),
            Value::Int(letter),
            Value::Int(attempts),
        ] => Ok(Claimed::Poisoned {
            crashes: count(crashes),
            attempts: count(attempts),
            letter: match letter {
                1 => Letter::Yours,
                2 => Letter::Held,
                _ => Letter::Written,
            },
        }),
        _ => Err(unexpected_claim_reply(reply)),
    }
}

/// A reply the claim script never gives.
fn unexpected_claim_reply(reply: &Value) -> Error {
    Error::Store(format!("unexpected reply to claim: {reply:?}"))
}

/// A count in a script's reply, saturated into a `u32`.
fn count(n: &i64) -> u32 {
    u32::try_from(*n).unwrap_or(u32::MAX)
}

/// A steps hash as `HGETALL` gives it: fields `<occurrence>:<name>`, each followed by its
/// value. A field this build cannot read is [`Error::Corrupt`].
fn decode_steps(reply: &Value) -> Result<Vec<StepRecord>, Error> {
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let pairs: Vec<&Value> = match reply {
        Value::Array(items) => items.iter().collect(),
        Value::Map(items) => items.iter().flat_map(|(k, v)| [k, v]).collect(),
        other => return Err(Error::Store(format!("unexpected steps reply: {other:?}"))),
    };
    let mut steps = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        let [field, value] = pair else {
            return Err(Error::Store("a steps reply of odd length".into()));
        };
        let (Some(field), Some(value)) = (bytes(field), bytes(value)) else {
            return Err(Error::Store(format!("unexpected steps reply: {reply:?}")));
        };
        let field = String::from_utf8_lossy(&field);
        // The job's count of attempts shares the hash (a step's field starts with a number).
        if field == "attempts" {
            continue;
        }
        let parsed = field
            .split_once(':')
            .and_then(|(n, name)| Some((n.parse::<u32>().ok()?, name)));
        let Some((occurrence, name)) = parsed else {
            return Err(Error::Corrupt(format!("a step field {field:?}")));
        };
        steps.push(StepRecord::new(name, occurrence, value));
    }
    Ok(steps)
}

/// Installs rustls' `ring` provider as the process default unless one is installed already, so
/// that the TLS handshake finds a provider whatever else the build enabled. The one installer:
/// every Redis connection (store or dead-letter sink, one server or a cluster) is made through
/// [`RedisConnection`], which calls it.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

// Reads the field at `i` of `v` (see `Field`): the field as written and the index after it, or
// nil when it is malformed. `now_ms`: the server's clock in milliseconds.
const FIELD: &str = r#"
local function field(v, i)
  if string.sub(v, i, i) == 'n' then return 'n', i + 1 end
  local s, e, len = string.find(v, '^(%d+):', i)
  if not s then return nil end
  local after = e + 1 + tonumber(len)
  if after > #v + 1 then return nil end
  return string.sub(v, i, after - 1), after
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(n) return string.format('%d', n) end
-- One more attempt in the job's steps hash (KEYS[2]), which then expires in `ttl` ms. No count
-- yet: only the key's first claim counted one.
local function count_attempt(ttl)
  local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '1') + 1
  redis.call('HSET', KEYS[2], 'attempts', attempts)
  redis.call('PEXPIRE', KEYS[2], ttl)
  return attempts
end
"#;

// KEYS[1]: the record, KEYS[2] (when the key has one) its steps. ARGV: the token's field, the
// fingerprint field, lease in ms, TTL in ms, crash limit (0: none), the longer of TTL and lease
// in ms (the claim's expiry).
// Returns {0, generation, crashes} acquired (a fresh key, or one without a steps hash),
// {0, generation, crashes, attempts, steps} acquired with the count of attempts and the steps
// hash's fields and values, {1, result} completed, {2, ms left} in progress, {3} reused,
// {4, why} corrupt, {5, crashes, letter, attempts} poisoned (letter: 1 this claim holds the
// letter role, 2 another claimer holds it, 0 the letter is confirmed; attempts 0: not counted).
// A poisoned key is `jg2/q<generation>:<crashes>:<ms>` while its letter is not confirmed (the
// letter role is held until <ms>, then handed to the next claimer), `jg2/p<generation>:<crashes>`
// once it is (and as every build before the letter role wrote it).
// An absent key, the common case, is claimed by the first `SET NX`, before the helpers are made:
// a fresh claim pays for no parsing.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}{FIELD}{}",
        r#"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease_end = string.format('%d', now + ARGV[3])
if redis.call('SET', KEYS[1], 'jg2/c' .. ARGV[1] .. ARGV[2] .. '1:0:' .. lease_end, 'NX', 'PX',
    ARGV[6]) then
  -- A fresh key: the steps of an expired record, if any outlived it, are not its.
  if KEYS[2] then redis.call('DEL', KEYS[2]) end
  return {0, 1, 0}
end
"#,
        r#"
local limit = tonumber(ARGV[5])
local function claim(generation, crashes)
  redis.call('SET', KEYS[1], 'jg2/c' .. ARGV[1] .. ARGV[2] .. num(generation) .. ':' ..
    num(crashes) .. ':' .. lease_end, 'PX', ARGV[6])
  if not KEYS[2] then return {0, generation, crashes} end
  -- The job's steps and its count of attempts live as long as its record, and come back with
  -- the claim.
  local attempts = count_attempt(ARGV[6])
  return {0, generation, crashes, attempts, redis.call('HGETALL', KEYS[2])}
end
-- Poisoned: the job's steps go; its count of attempts stays, for its letter, as long as the key.
local function poisoned()
  if not KEYS[2] then return 0 end
  local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '1')
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'attempts', attempts)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return attempts
end
local function counted()
  if not KEYS[2] then return 0 end
  return tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return {4, 'not a jobguard record: ' .. (type(v) == 'table' and v['err'] or 'missing')}
end
local version = string.match(v, '^jg(%d+)/')
if not version then return {4, 'not a jobguard record'} end
if version ~= '1' and version ~= '2' then
  return {4, 'record format version ' .. version .. ' (this build reads 1 and 2)'}
end
local state = string.sub(v, 5, 5)
local i, fp = 6, nil
local function reused() return fp ~= 'n' and ARGV[2] ~= 'n' and fp ~= ARGV[2] end
if state == 'c' then
  local token
  token, i = field(v, i)
  if not token or token == 'n' then return {4, 'a claim without a token'} end
  fp, i = field(v, i)
  if not fp then return {4, 'a malformed fingerprint'} end
  if version == '1' then
    if i ~= #v + 1 then return {4, 'trailing bytes after a claim'} end
    if reused() then return {3} end
    local left = redis.call('PTTL', KEYS[1])
    if left < 0 then return {4, 'a claim without an expiry'} end
    return {2, left}
  end
  local g, c, e = string.match(v, '^(%d+):(%d+):(%d+)$', i)
  if not g then return {4, 'a malformed claim'} end
  local ends = tonumber(e)
  if ends > now then
    if reused() then return {3} end
    return {2, ends - now}
  end
  -- Abandoned: its worker died (or stalled past its lease). Counted.
  local crashes = tonumber(c) + 1
  if limit > 0 and crashes >= limit then
    redis.call('SET', KEYS[1], 'jg2/q' .. g .. ':' .. num(crashes) .. ':' .. lease_end, 'PX',
      ARGV[4])
    return {5, crashes, 1, poisoned()}
  end
  return claim(tonumber(g) + 1, crashes)
end
if version == '1' and state == 'd' then
  fp, i = field(v, i)
  if not fp then return {4, 'a malformed fingerprint'} end
  if reused() then return {3} end
  return {1, string.sub(v, i)}
end
if version == '2' and state == 'q' then
  local g, c, e = string.match(v, '^(%d+):(%d+):(%d+)$', 6)
  if not g then return {4, 'a malformed record'} end
  -- No letter confirmed: the role goes to this claimer once the last holder's lease ended.
  if tonumber(e) > now then return {5, tonumber(c), 2, counted()} end
  redis.call('SET', KEYS[1], 'jg2/q' .. g .. ':' .. c .. ':' .. lease_end, 'KEEPTTL')
  return {5, tonumber(c), 1, counted()}
end
if version == '2' and (state == 'f' or state == 'p') then
  local g, c = string.match(v, '^(%d+):(%d+)$', 6)
  if not g then return {4, 'a malformed record'} end
  local crashes = tonumber(c)
  if state == 'p' then return {5, crashes, 0, counted()} end
  if limit > 0 and crashes >= limit then
    redis.call('SET', KEYS[1], 'jg2/q' .. g .. ':' .. c .. ':' .. lease_end, 'PX', ARGV[4])
    return {5, crashes, 1, poisoned()}
  end
  return claim(tonumber(g) + 1, crashes)
end
return {4, 'unknown record state ' .. state .. ' in version ' .. version}
"#
    ))
});

// The check shared by the token scripts: ARGV[1] is `jg2/c` and the token's field; does the
// record start with it, and is that claim's lease still running (the token holds the claim)?
// Leaves `fp` (the fingerprint's field), `g` and `c` (generation and crashes, as written) and
// `now`.
macro_rules! held {
    ($body:literal) => {
        concat!(
            r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
local fp, i = field(v, #ARGV[1] + 1)
if not fp then return 0 end
local g, c, e = string.match(v, '^(%d+):(%d+):(%d+)$', i)
if not g then return 0 end
local now = now_ms()
if tonumber(e) <= now then return 0 end
"#,
            $body
        )
    };
}

// ARGV: claim prefix, result, ttl in ms. Keeps the fingerprint with the result; the job's steps
// (KEYS[2]) go.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
redis.call('SET', KEYS[1], 'jg1/d' .. fp .. ARGV[2], 'PX', ARGV[3])
if KEYS[2] then redis.call('DEL', KEYS[2]) end
return 1
"#
        )
    ))
});

// KEYS[1]: the record. Returns {1, result} for a completed record, {0} for no record or one in
// any other state, {4, why} for a value that is not a string, or a completed record whose
// fingerprint cannot be read. Reads only: a status page's view of the key.
static LOOKUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        r#"
local v = redis.pcall('GET', KEYS[1])
if not v then return {0} end
if type(v) ~= 'string' then
  return {4, 'not a jobguard record: ' .. (type(v) == 'table' and v['err'] or 'missing')}
end
if string.sub(v, 1, 5) ~= 'jg1/d' then return {0} end
local fp, i = field(v, 6)
if not fp then return {4, 'a malformed fingerprint'} end
return {1, string.sub(v, i)}
"#
    ))
});

// KEYS[1]: the record, KEYS[2] its steps. Forgives the key's crashes: a poisoned key, or a claim
// whose lease ended, becomes a released key without crashes (its generation and expiry kept,
// its steps dropped); a released
// key's count goes back to 0. Returns {1} when it cleared a crash or a poisoned key, {0} when
// there was nothing to clear (no record, a completed one, a live claim, a released key without
// crashes, a version-1 claim: live while it exists), {4, why} for a record this build cannot
// read, which is left in place as `claim` leaves it.
static FORGIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        r#"
local v = redis.pcall('GET', KEYS[1])
if not v then return {0} end
if type(v) ~= 'string' then
  return {4, 'not a jobguard record: ' .. (type(v) == 'table' and v['err'] or 'missing')}
end
local version = string.match(v, '^jg(%d+)/')
if not version then return {4, 'not a jobguard record'} end
if version ~= '1' and version ~= '2' then
  return {4, 'record format version ' .. version .. ' (this build reads 1 and 2)'}
end
local state = string.sub(v, 5, 5)
if version == '1' then
  if state == 'c' or state == 'd' then return {0} end
  return {4, 'unknown record state ' .. state .. ' in version 1'}
end
local g, c
if state == 'c' then
  local token, i = field(v, 6)
  if not token or token == 'n' then return {4, 'a claim without a token'} end
  local fp
  fp, i = field(v, i)
  if not fp then return {4, 'a malformed fingerprint'} end
  local e
  g, c, e = string.match(v, '^(%d+):(%d+):(%d+)$', i)
  if not g then return {4, 'a malformed claim'} end
  if tonumber(e) > now_ms() then return {0} end
elseif state == 'f' or state == 'p' then
  g, c = string.match(v, '^(%d+):(%d+)$', 6)
  if not g then return {4, 'a malformed record'} end
  if state == 'f' and tonumber(c) == 0 then return {0} end
elseif state == 'q' then
  g, c = string.match(v, '^(%d+):(%d+):%d+$', 6)
  if not g then return {4, 'a malformed record'} end
else
  return {4, 'unknown record state ' .. state .. ' in version 2'}
end
redis.call('SET', KEYS[1], 'jg2/f' .. g .. ':0', 'KEEPTTL')
if KEYS[2] then redis.call('DEL', KEYS[2]) end
return {1}
"#
    ))
});

// KEYS[1]: the record. Reads only, for an operator's console. Returns {0} for no record,
// {1, result} completed, {2, generation, crashes, ms left on the lease (0 once it ended)} a
// claim (a version-1 claim: generation and crashes 0, its PTTL), {3, generation, crashes} a
// released key, {5, generation, crashes} a poisoned one, {4, why} a record this build cannot
// read.
static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        r#"
local v = redis.pcall('GET', KEYS[1])
if not v then return {0} end
if type(v) ~= 'string' then
  return {4, 'not a jobguard record: ' .. (type(v) == 'table' and v['err'] or 'missing')}
end
local version = string.match(v, '^jg(%d+)/')
if not version then return {4, 'not a jobguard record'} end
if version ~= '1' and version ~= '2' then
  return {4, 'record format version ' .. version .. ' (this build reads 1 and 2)'}
end
local state = string.sub(v, 5, 5)
if state == 'd' then
  local fp, i = field(v, 6)
  if not fp then return {4, 'a malformed fingerprint'} end
  return {1, string.sub(v, i)}
end
if version == '1' then
  if state == 'c' then return {2, 0, 0, math.max(redis.call('PTTL', KEYS[1]), 0)} end
  return {4, 'unknown record state ' .. state .. ' in version 1'}
end
if state == 'c' then
  local token, i = field(v, 6)
  if not token or token == 'n' then return {4, 'a claim without a token'} end
  local fp
  fp, i = field(v, i)
  if not fp then return {4, 'a malformed fingerprint'} end
  local g, c, e = string.match(v, '^(%d+):(%d+):(%d+)$', i)
  if not g then return {4, 'a malformed claim'} end
  return {2, tonumber(g), tonumber(c), math.max(tonumber(e) - now_ms(), 0)}
end
local g, c = string.match(v, '^(%d+):(%d+)', 6)
if not g then return {4, 'a malformed record'} end
if state == 'f' then return {3, tonumber(g), tonumber(c)} end
if state == 'p' or state == 'q' then return {5, tonumber(g), tonumber(c)} end
return {4, 'unknown record state ' .. state .. ' in version 2'}
"#
    ))
});

// KEYS[1]: the record. A poisoned key whose letter is not confirmed (`jg2/q`) becomes one whose
// letter is (`jg2/p`), with its expiry; anything else is left alone. Returns 1 when it marked it.
static LETTERED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return 0 end
local g, c = string.match(v, '^jg2/q(%d+):(%d+):%d+$')
if not g then return 0 end
redis.call('SET', KEYS[1], 'jg2/p' .. g .. ':' .. c, 'KEEPTTL')
return 1
"#,
    )
});

// ARGV: claim prefix. Keeps the generation and the crash count, with the claim's expiry.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
redis.call('SET', KEYS[1], 'jg2/f' .. g .. ':' .. c, 'KEEPTTL')
return 1
"#
        )
    ))
});

// ARGV: claim prefix, lease in ms. The key lives at least as long as the new lease.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
local lease = tonumber(ARGV[2])
local keep = math.max(redis.call('PTTL', KEYS[1]), lease)
redis.call('SET', KEYS[1], string.sub(v, 1, i - 1) .. g .. ':' .. c .. ':' .. num(now + lease),
  'PX', num(keep))
if KEYS[2] then redis.call('PEXPIRE', KEYS[2], num(keep)) end
return 1
"#
        )
    ))
});

// KEYS[1]: the record, KEYS[2]: its steps. ARGV: claim prefix, the step's field
// (`<occurrence>:<name>`), its value. The steps hash expires with the record.
static RECORD_STEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], math.max(redis.call('PTTL', KEYS[1]), 1))
return 1
"#
        )
    ))
});

// KEYS[1]: the record, KEYS[2]: its steps and count of attempts. ARGV: claim prefix. Counts one
// more attempt (no count yet: only the key's first claim counted one) and returns the count; 0
// when the token does not hold the claim.
static ATTEMPTED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FIELD}{}",
        held!(
            r#"
return count_attempt(math.max(redis.call('PTTL', KEYS[1]), 1))
"#
        )
    ))
});

// KEYS[1]: the record, KEYS[2]: its steps. The steps' fields and values while the record is a
// claim (of either version) or a released key; none otherwise.
static STEPS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return {} end
local head = string.sub(v, 1, 5)
if head ~= 'jg2/c' and head ~= 'jg2/f' and head ~= 'jg1/c' then return {} end
return redis.call('HGETALL', KEYS[2])
"#,
    )
});

impl Store for RedisStore {
    fn claim<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        options: ClaimOptions<'a>,
    ) -> StoreFuture<'a, Claimed> {
        // The claim's script returns the job's steps and count of attempts: one round trip.
        Box::pin(self.claim_counted(key, token, options))
    }

    /// One script on the record and its steps: one more attempt in the steps hash while
    /// `token` holds the claim.
    fn attempted<'a>(&'a self, key: StoreKey<'a>, token: &'a str) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            let (mut call, keeps_steps) = Self::invocation(&ATTEMPTED, key);
            if !keeps_steps {
                return Err(no_steps(key));
            }
            call.arg(format!("{CLAIMED}{}", Field(Some(token))));
            let attempts: i64 = self
                .invoke(&call)
                .await
                .map_err(|e| store_error("attempted failed", &e))?;
            match u32::try_from(attempts) {
                Ok(0) | Err(_) => Err(Error::LeaseLost),
                Ok(attempts) => Ok(attempts),
            }
        })
    }

    /// One script on the record and its steps: `HSET` while `token` holds the claim.
    fn record_step<'a>(
        &'a self,
        key: StoreKey<'a>,
        token: &'a str,
        step: StepKey<'a>,
        value: &'a [u8],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (call, keeps_steps) = Self::invocation(&RECORD_STEP, key);
            if !keeps_steps {
                return Err(no_steps(key));
            }
            let field = format!("{}:{}", step.occurrence, step.name);
            let args: [&[u8]; 2] = [field.as_bytes(), value];
            match self.held(call, token, &args, "record step failed").await? {
                true => Ok(()),
                false => Err(Error::LeaseLost),
            }
        })
    }

    fn steps<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Vec<StepRecord>> {
        Box::pin(async move {
            let (call, keeps_steps) = Self::invocation(&STEPS, key);
            if !keeps_steps {
                return Err(no_steps(key));
            }
            let reply: Value = self
                .invoke(&call)
                .await
                .map_err(|e| store_error("steps failed", &e))?;
            decode_steps(&reply)
        })
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

    /// One script, decoding the record where the other scripts do: only a completed one
    /// answers with its result.
    fn lookup<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let reply: Value = self
                .invoke(&LOOKUP.key(Self::redis_key(key)))
                .await
                .map_err(|e| store_error("lookup failed", &e))?;
            match &reply {
                Value::Array(items) => match items.as_slice() {
                    [Value::Int(1), Value::BulkString(result)] => Ok(Some(result.clone())),
                    [Value::Int(0)] => Ok(None),
                    [Value::Int(4), why] => Err(corrupt(why)),
                    _ => Err(Error::Store(format!(
                        "unexpected reply to lookup: {reply:?}"
                    ))),
                },
                _ => Err(Error::Store(format!(
                    "unexpected reply to lookup: {reply:?}"
                ))),
            }
        })
    }

    /// One script on the key (on a cluster, on its slot's master): a poisoned key or a lapsed
    /// claim becomes a released key without crashes, a released key's count goes back to 0.
    fn forgive<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let reply: Value = self
                .invoke(&Self::invocation(&FORGIVE, key).0)
                .await
                .map_err(|e| store_error("forgive failed", &e))?;
            decode_forgive(reply)
        })
    }

    /// One script on the key, which reads it and the server's clock and writes nothing.
    fn inspect<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, KeyInfo> {
        Box::pin(async move {
            let reply: Value = self
                .invoke(&INSPECT.key(Self::redis_key(key)))
                .await
                .map_err(|e| store_error("inspect failed", &e))?;
            decode_inspect(reply)
        })
    }

    /// `DEL` of the key's record, whatever its state, and of its steps.
    fn forget<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // One round trip: the steps share the record's slot.
            let record = Self::redis_key(key);
            let mut pipe = redis::pipe();
            if let Some(steps) = Self::steps_key(&record) {
                pipe.del(steps).ignore();
            }
            let (removed,): (u64,) = pipe
                .del(record)
                .query_async(&mut self.connection.clone())
                .await
                .map_err(|e| store_error("forget failed", &e))?;
            Ok(removed > 0)
        })
    }

    /// One script on the key: a poisoned key whose letter is not confirmed is marked lettered.
    fn lettered<'a>(&'a self, key: StoreKey<'a>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let _: Value = self
                .invoke(&LETTERED.key(Self::redis_key(key)))
                .await
                .map_err(|e| store_error("lettered failed", &e))?;
            Ok(())
        })
    }
}

/// The refusal of a key that keeps no steps (see [`RedisStore::steps_key`]).
fn no_steps(key: StoreKey<'_>) -> Error {
    Error::Config(format!(
        "the key {:?} of {:?} holds a `}}` outside a Redis Cluster hash tag, so no key of its \
         steps can share its slot: its job keeps no durable steps; key it without `}}`",
        key.key, key.scope
    ))
}

/// The inspect script's reply (see `INSPECT`).
fn decode_inspect(reply: Value) -> Result<KeyInfo, Error> {
    let unexpected = |r: &Value| Error::Store(format!("unexpected reply to inspect: {r:?}"));
    let Value::Array(items) = &reply else {
        return Err(unexpected(&reply));
    };
    let number = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    let history = |g: &Value, c: &Value| {
        let g = number(g)?;
        let c = u32::try_from(number(c)?).ok()?;
        Some((g, c))
    };
    match items.as_slice() {
        [Value::Int(0)] => Ok(KeyInfo::free()),
        [Value::Int(1), Value::BulkString(result)] => {
            Ok(KeyInfo::new(KeyState::Completed, None, 0).result(result.clone()))
        }
        [Value::Int(1), Value::SimpleString(result)] => {
            Ok(KeyInfo::new(KeyState::Completed, None, 0).result(result.clone().into_bytes()))
        }
        [Value::Int(2), g, c, left] => {
            let ((g, c), left) = history(g, c)
                .zip(number(left))
                .ok_or_else(|| unexpected(&reply))?;
            let generation = (g > 0).then_some(g);
            Ok(KeyInfo::new(KeyState::Claimed, generation, c)
                .lease_left(Duration::from_millis(left)))
        }
        [Value::Int(3), g, c] => {
            let (g, c) = history(g, c).ok_or_else(|| unexpected(&reply))?;
            Ok(KeyInfo::new(KeyState::Free, Some(g), c))
        }
        [Value::Int(5), g, c] => {
            let (g, c) = history(g, c).ok_or_else(|| unexpected(&reply))?;
            Ok(KeyInfo::new(KeyState::Poisoned, Some(g), c))
        }
        [Value::Int(4), why] => Err(corrupt(why)),
        _ => Err(unexpected(&reply)),
    }
}

/// The forgive script's reply: `{1}` forgiven, `{0}` nothing to forgive, `{4, why}` corrupt.
fn decode_forgive(reply: Value) -> Result<bool, Error> {
    let unexpected = |r: &Value| Error::Store(format!("unexpected reply to forgive: {r:?}"));
    let Value::Array(items) = &reply else {
        return Err(unexpected(&reply));
    };
    match items.as_slice() {
        [Value::Int(1)] => Ok(true),
        [Value::Int(0)] => Ok(false),
        [Value::Int(4), why] => Err(corrupt(why)),
        _ => Err(unexpected(&reply)),
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

    #[test]
    fn only_noeviction_or_no_maxmemory_keeps_every_claim() {
        assert_eq!(eviction_risk("0", "allkeys-lru"), None);
        assert_eq!(eviction_risk("104857600", "noeviction"), None);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(eviction_risk("104857600", policy).is_some(), "{policy}");
        }
        assert!(
            eviction_risk("1", "allkeys-lru")
                .unwrap()
                .contains("live claims")
        );
        assert!(
            eviction_risk("1", "volatile-ttl")
                .unwrap()
                .contains("claim")
        );
    }

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
        let claimed = |reply| decode_claim(reply, true);
        assert_eq!(
            claimed(Array(vec![Int(0), Int(1), Int(0)])),
            Ok(Claimed::Acquired {
                generation: 1,
                crashes: 0,
                attempts: 1,
                steps: Some(Vec::new())
            })
        );
        assert_eq!(
            decode_claim(Array(vec![Int(0), Int(4), Int(3)]), false),
            Ok(Claimed::Acquired {
                generation: 4,
                crashes: 3,
                attempts: 0,
                steps: None
            })
        );
        assert_eq!(
            claimed(Array(vec![Int(1), BulkString(b"{}".to_vec())])),
            Ok(Claimed::Completed(b"{}".to_vec()))
        );
        assert_eq!(
            claimed(Array(vec![Int(2), Int(250)])),
            Ok(Claimed::InProgress {
                retry_in: Duration::from_millis(250)
            })
        );
        assert_eq!(claimed(Array(vec![Int(3)])), Ok(Claimed::KeyReused));
        assert_eq!(
            claimed(Array(vec![Int(4), BulkString(b"bad".to_vec())])),
            Err(Error::Corrupt("bad".into()))
        );
        assert_eq!(
            claimed(Array(vec![Int(5), Int(3), Int(1), Int(7)])),
            Ok(Claimed::Poisoned {
                crashes: 3,
                attempts: 7,
                letter: Letter::Yours
            })
        );
        assert_eq!(
            claimed(Array(vec![Int(5), Int(3), Int(0), Int(7)])),
            Ok(Claimed::Poisoned {
                crashes: 3,
                attempts: 7,
                letter: Letter::Written
            })
        );
        assert!(matches!(claimed(Int(7)), Err(Error::Store(_))));
        assert!(matches!(claimed(Array(vec![Int(9)])), Err(Error::Store(_))));
        assert!(matches!(claimed(Array(vec![Int(0)])), Err(Error::Store(_))));
    }

    #[test]
    fn an_acquired_claim_brings_its_steps() {
        use Value::*;
        let field = |s: &str| BulkString(s.as_bytes().to_vec());
        let steps = Array(vec![
            field("1:capture.v1"),
            field("{}"),
            field("2:a:b"),
            field("x"),
            field("attempts"),
            field("3"),
        ]);
        let reply = Array(vec![Int(0), Int(2), Int(1), Int(3), steps]);
        assert_eq!(
            decode_claim(reply, true),
            Ok(Claimed::Acquired {
                generation: 2,
                crashes: 1,
                attempts: 3,
                steps: Some(vec![
                    StepRecord::new("capture.v1", 1, b"{}".to_vec()),
                    StepRecord::new("a:b", 2, b"x".to_vec())
                ])
            })
        );
        let bad = Array(vec![field("capture"), field("{}")]);
        assert!(matches!(decode_steps(&bad), Err(Error::Corrupt(_))));
    }

    #[test]
    fn a_jobs_steps_share_its_records_slot() {
        assert_eq!(hash_tag("a{b}c"), Some("b"));
        assert_eq!(hash_tag("a{}c{d}"), None);
        assert_eq!(hash_tag("a{b"), None);
        for record in [
            "jobguard:s:k",
            "jobguard:s:{t}k",
            "jobguard:s:{",
            "jobguard:{x:k{y}",
        ] {
            let steps = RedisStore::steps_key(record).unwrap();
            let slot = |k: &str| hash_tag(k).unwrap_or(k).to_owned();
            assert_eq!(slot(&steps), slot(record), "{record}");
        }
        assert_eq!(RedisStore::steps_key("jobguard:s:{}k}"), None);
    }

    #[test]
    fn forgive_replies_decode() {
        use Value::*;
        assert_eq!(decode_forgive(Array(vec![Int(1)])), Ok(true));
        assert_eq!(decode_forgive(Array(vec![Int(0)])), Ok(false));
        assert_eq!(
            decode_forgive(Array(vec![Int(4), BulkString(b"bad".to_vec())])),
            Err(Error::Corrupt("bad".into()))
        );
        assert!(matches!(decode_forgive(Int(1)), Err(Error::Store(_))));
        assert!(matches!(
            decode_forgive(Array(vec![Int(2)])),
            Err(Error::Store(_))
        ));
    }
}
