//! Fleet-wide protection (feature `redis`): one circuit breaker and one retry budget for every
//! worker process, through Redis.
//!
//! (The README's "Fleet-wide protection" shows this module's example; here it compiles.)
//!
//! A fleet of twenty workers with a breaker each has twenty breakers: each must fail on its own
//! before it opens, and each sends its own probes. [`CircuitBreaker::share`] and
//! [`RetryBudget::share`] make one of each for every process that shares a name:
//!
#![cfg_attr(feature = "macros", doc = "```no_run")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! use jobguard::{CircuitBreaker, RedisStore, RetryBudget};
//! use std::time::Duration;
//!
//! static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30)).named("gateway");
//! // One retry per ten calls, plus one a second, over ten seconds.
//! static GATEWAY_RETRIES: RetryBudget = RetryBudget::new(0.1, 1, Duration::from_secs(10));
//!
//! #[jobguard::retry(attempts = 4, breaker = GATEWAY, retry_budget = GATEWAY_RETRIES)]
//! async fn capture(order_id: &str) -> Result<u64, std::io::Error> {
//!     # let _ = order_id;
//!     Ok(100) // the gateway's call
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = RedisStore::connect("redis://127.0.0.1:6380/").await?;
//!     GATEWAY.share(&store, "gateway").await?;          // every process that runs these two
//!     GATEWAY_RETRIES.share(&store, "gateway").await?;  // lines shares one breaker, one budget
//!     capture("order-A").await?;
//!     Ok(())
//! }
//! ```
//!
//! # The breaker
//!
//! - **The success path stays local.** A shared breaker admits a call as an unshared one does:
//!   one atomic load of its own state, and a success is one more, with no round trip. What the
//!   fleet decides reaches each process as a message it applies to that local state.
//! - **Failures are counted in Redis.** A transient failure runs one script (one round trip)
//!   that counts it and, when the breaker's rule is met, opens the breaker for the fleet; the
//!   retry loop waits for that answer before it decides, so the call that opened the breaker
//!   stops at once. Every script is atomic (no read-then-write across round trips).
//! - **An opening reaches every process within one round trip**: the script publishes each
//!   transition on the breaker's channel, which every sharing process subscribes to.
//! - **Half-open admits one probe across the fleet.** When the cooldown ends, the processes ask
//!   Redis for the probe; one gets it (and turns half-open, with the breaker's
//!   [`probes`](CircuitBreaker::probes) slots), the others stay open. The probe's outcome closes
//!   or re-opens the breaker for everyone. A holder that never reports loses the probe after one
//!   cooldown, and another process takes it.
//! - **One process's burst is weighed against the fleet's successes**, by the breaker's own rule:
//!   - [`CircuitBreaker::new`]`(n, ..)` opens after `n` transient failures in a row *across the
//!     fleet*: one count in Redis, which any success anywhere resets. The success path stays
//!     local because each process keeps the fleet's count (every failure publishes it): a
//!     success is reported (in the background, off the call's path) only when that count is not
//!     zero. A success therefore resets the count within one round trip of the failure that made
//!     it non-zero, and a worker with a burst of failures cannot open the breaker while others
//!     succeed between its failures.
//!   - [`CircuitBreaker::failure_rate`]`(ratio, window, ..)` opens when, over the windows of
//!     every process (each its own last `window` calls), the failures reach `ratio` of the calls,
//!     once the windows hold [`min_calls`](CircuitBreaker::min_calls) calls together. Each
//!     process hands Redis its window with each failure, and, while some window holds a failure,
//!     after its successes too (in the background); a window not handed over for 60 seconds
//!     stops counting. So one worker's window full of failures is weighed against the other
//!     workers' windows full of successes.
//! - **Redis out of reach**: when a script fails or the subscription drops, the process falls
//!   back to its own breaker, which goes on from the state it had (the fleet's last word),
//!   counting and opening by its own rule; it raises [`Event::Shared`] with `shared: false` (and
//!   the `metrics` feature sets `jobguard_shared` to 0). It tries to subscribe again, at most a
//!   second apart, and when Redis answers it rejoins (raising `shared: true`): it adopts the
//!   fleet's state, or, when it opened on its own while the fleet's breaker is closed, opens the
//!   fleet's for the rest of its cooldown.
//! - [`trip`](CircuitBreaker::trip) and [`reset`](CircuitBreaker::reset) act on this process's
//!   breaker only.
//!
//! # The retry budget
//!
//! A shared budget keeps its slots in Redis. A call deposits in the process's own slots as an
//! unshared budget does (no round trip); a retry runs one script that hands the fleet this
//! process's deposits so far and takes the retry if the fleet's balance holds one. A process
//! also hands over its deposits once a slot (a tenth of the window) in the background, so that
//! the calls of a worker that never retries fund the retries of one that does. The fleet's
//! floor is `min_per_sec × window` once for the whole fleet, not per process. A deposit counts
//! from when the fleet gets it, so it may count for up to a slot longer than its window. Out of
//! reach, the budget is the process's own again (with [`Event::Shared`]), until a hand-over
//! succeeds.
//!
//! # Keys
//!
//! A breaker shared as `name` is one hash, `jobguard:{breaker:name}`, and publishes on the
//! channel of the same name; a budget is one hash, `jobguard:{retry_budget:name}`. The braces
//! are a hash tag: on a Redis Cluster each one's keys are in one slot, and each script runs on
//! that slot's master. Subscriptions go to the server, or to the first seed node of a cluster
//! that answers (Redis forwards every publication to every node).
//!
//! Every process that shares a name must share it with the same settings (threshold or ratio,
//! window, cooldown); the scripts use the settings of the process that runs them.

use crate::breaker::{self, CircuitBreaker, Fleet, Link as _, Reporting, Rule};
use crate::budget::{self, Asking, RetryBudget};
use crate::observe::Event;
use crate::store::redis::RedisStore;
use crate::{Error, Runtime};
use futures_core::Stream;
use redis::Script;
use redis::aio::PubSubStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::Notify;

/// How long a failure-rate breaker's window, once handed to Redis, counts for the fleet.
pub const WINDOW_STALE: Duration = Duration::from_secs(60);

/// The shortest and longest wait between two attempts to reach Redis again.
const REJOIN_FIRST: Duration = Duration::from_millis(50);
const REJOIN_MAX: Duration = Duration::from_secs(1);

impl CircuitBreaker {
    /// Shares this breaker with every process that shares `name` through `store`'s Redis: from
    /// now on its failures and transitions are the fleet's. See the [module docs](crate::fleet)
    /// for how, and what happens when Redis is out of reach.
    ///
    /// Needs a tokio runtime (a task per shared breaker listens to the fleet) and a store that
    /// knows its address ([`RedisStore::connect`], [`RedisStore::connect_cluster`], or
    /// [`RedisStore::subscribing_through`]). Errors: [`Error::Store`] when Redis cannot be
    /// reached now; [`Error::Config`] when the breaker is shared already, the store knows no
    /// address, or there is no tokio runtime.
    ///
    /// ```no_run
    /// use jobguard::{CircuitBreaker, RedisStore};
    /// use std::time::Duration;
    ///
    /// static GATEWAY: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(30));
    ///
    /// # async fn demo() -> Result<(), jobguard::Error> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6380/").await?;
    /// GATEWAY.share(&store, "gateway").await?;
    /// # Ok(()) }
    /// ```
    pub async fn share(&'static self, store: &RedisStore, name: &str) -> Result<(), Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config(format!(
                "breaker {name:?}: `share` needs a tokio runtime, for the task that listens to the fleet"
            ))
        })?;
        if self.link.get().is_some() {
            return Err(already(name, "breaker"));
        }
        let link = Arc::new(BreakerLink {
            breaker: self,
            store: store.clone(),
            name: name.to_owned(),
            key: format!("jobguard:{{breaker:{name}}}"),
            me: process_id(),
            attached: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            probing: AtomicU64::new(0),
            success: AtomicBool::new(false),
            wake: Notify::new(),
        });
        let messages = link.join().await?;
        let shared: Arc<dyn breaker::Link> = link.clone();
        self.link
            .set(shared)
            .map_err(|_| already(name, "breaker"))?;
        runtime.spawn(link.listen(messages));
        Ok(())
    }
}

impl RetryBudget {
    /// Shares this budget with every process that shares `name` through `store`'s Redis: from
    /// now on retries are taken from the fleet's balance, which every process's calls fund. See
    /// the [module docs](crate::fleet#the-retry-budget).
    ///
    /// Needs a tokio runtime (a task per shared budget hands this process's deposits to the
    /// fleet). Errors: [`Error::Store`] when Redis cannot be reached now; [`Error::Config`] when
    /// the budget is shared already, or there is no tokio runtime.
    ///
    /// ```no_run
    /// use jobguard::{RedisStore, RetryBudget};
    /// use std::time::Duration;
    ///
    /// static RETRIES: RetryBudget = RetryBudget::new(0.1, 1, Duration::from_secs(10));
    ///
    /// # async fn demo() -> Result<(), jobguard::Error> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6380/").await?;
    /// RETRIES.share(&store, "gateway").await?;
    /// # Ok(()) }
    /// ```
    pub async fn share(&'static self, store: &RedisStore, name: &str) -> Result<(), Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config(format!(
                "retry budget {name:?}: `share` needs a tokio runtime, for the task that hands \
                 deposits to the fleet"
            ))
        })?;
        if self.link.get().is_some() {
            return Err(already(name, "retry budget"));
        }
        let link = Arc::new(BudgetLink {
            budget: self,
            store: store.clone(),
            name: name.to_owned(),
            key: format!("jobguard:{{retry_budget:{name}}}"),
            attached: AtomicBool::new(false),
        });
        link.hand_over(0).await?;
        link.attached.store(true, Ordering::Release);
        let shared: Arc<dyn budget::Link> = link.clone();
        self.link
            .set(shared)
            .map_err(|_| already(name, "retry budget"))?;
        runtime.spawn(link.flush_every_slot());
        Ok(())
    }
}

fn already(name: &str, what: &str) -> Error {
    Error::Config(format!(
        "{what} {name:?} is shared already: `share` it once per process"
    ))
}

/// A name for this process among the fleet's: its pid and a random number.
fn process_id() -> String {
    format!("{}-{:016x}", std::process::id(), rand::random::<u64>())
}

/// Raises [`Event::Shared`] on the runtime in scope.
fn tell(kind: &str, name: &str, shared: bool, error: Option<&dyn std::fmt::Display>) {
    Runtime::current().emit(&Event::Shared {
        kind,
        name,
        shared,
        error,
    });
}

/// A shared breaker's side of the fleet: its Redis, its subscription, and what it last heard.
struct BreakerLink {
    breaker: &'static CircuitBreaker,
    store: RedisStore,
    name: String,
    /// The hash, and the channel of the same name.
    key: String,
    /// This process among the fleet's, as the probe's holder and a window's owner.
    me: String,
    /// Whether the fleet decides (`false`: Redis is out of reach, and the breaker is local).
    attached: AtomicBool,
    /// The fleet's epoch last applied: a transition numbered lower is old news.
    epoch: AtomicU64,
    /// The fleet's failures last heard of: in a row, or in the windows.
    failures: AtomicU64,
    /// The epoch of the half-open state whose probe this process holds (0: none).
    probing: AtomicU64,
    /// A success waits to be reported.
    success: AtomicBool,
    /// Wakes the listening task: a success to report, a probe wanted, Redis lost.
    wake: Notify,
}

/// The fleet's answer to every breaker script: `{code, epoch, ms, failures}`, `code` 0 closed,
/// 1 open (`ms` of cooldown left), 2 half-open with this process holding the probe, 3
/// half-open with another holding it (`ms` of its lease left).
type Answer = (i64, u64, u64, u64);

impl breaker::Link for BreakerLink {
    fn attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    fn dirty(&self) -> bool {
        self.failures.load(Ordering::Relaxed) > 0
    }

    fn failed(self: Arc<Self>, epoch: u32) -> Reporting {
        Box::pin(async move {
            let mut call = self.outcome(&FAILED);
            call.arg(millis(self.breaker.cooldown()));
            match self.run(&call).await {
                Ok(answer) => self.apply(answer),
                Err(e) => {
                    self.lost(&e);
                    self.breaker.unheard_failure(epoch);
                }
            }
        })
    }

    fn settled(self: Arc<Self>, closed: bool) -> Reporting {
        Box::pin(async move {
            let epoch = self.probing.swap(0, Ordering::AcqRel);
            let mut call = SETTLE.key(&self.key);
            self.common(&mut call);
            call.arg(epoch)
                .arg(u8::from(closed))
                .arg(millis(self.breaker.cooldown()));
            match self.run(&call).await {
                Ok(answer) => self.apply(answer),
                Err(e) => self.lost(&e),
            }
        })
    }

    fn succeeded(&self) {
        // Read first: while a success is already waiting to be reported, every other success
        // leaves the shared cache line alone.
        if !self.success.load(Ordering::Relaxed) && !self.success.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    fn probe_wanted(&self) {
        self.wake.notify_one();
    }
}

impl BreakerLink {
    /// The first arguments of every script: the channel and this process.
    fn common(&self, call: &mut redis::ScriptInvocation<'_>) {
        call.arg(&self.key).arg(&self.me);
    }

    /// A call of a script that hears of outcomes (`FAILED`, `SUCCEEDED`): the channel, this
    /// process, the breaker's rule (`c threshold 0` or `r ppm min_calls`), this process's
    /// window (calls, failures) and how long a window counts.
    fn outcome<'s>(&self, script: &'s Script) -> redis::ScriptInvocation<'s> {
        let mut call = script.key(&self.key);
        self.common(&mut call);
        match self.breaker.rule() {
            Rule::Consecutive { threshold } => call.arg("c").arg(threshold).arg(0),
            Rule::Rate { ppm, min_calls } => call.arg("r").arg(ppm).arg(min_calls),
        };
        let (calls, failures) = self.breaker.window_counts();
        call.arg(calls).arg(failures).arg(millis(WINDOW_STALE));
        call
    }

    async fn run(&self, call: &redis::ScriptInvocation<'_>) -> Result<Answer, Error> {
        let reply: Vec<i64> = self
            .store
            .invoke(call)
            .await
            .map_err(|e| Error::Store(format!("shared breaker {:?}: {e}", self.name)))?;
        match reply.as_slice() {
            &[code, epoch, ms, failures] => Ok((code, count(epoch), count(ms), count(failures))),
            _ => Err(Error::Store(format!(
                "shared breaker {:?}: unexpected reply {reply:?}",
                self.name
            ))),
        }
    }

    /// Applies the fleet's word to the local breaker, unless a later transition was applied.
    fn apply(&self, (code, epoch, ms, failures): Answer) {
        if epoch < self.epoch.fetch_max(epoch, Ordering::AcqRel) {
            return;
        }
        self.failures.store(failures, Ordering::Relaxed);
        let ms = Duration::from_millis(ms);
        let fleet = match code {
            0 => Fleet::Closed { failures },
            1 => Fleet::Open { left: ms },
            2 => {
                self.probing.store(epoch, Ordering::Release);
                Fleet::Probing
            }
            _ => Fleet::Open { left: ms },
        };
        self.breaker.adopt(fleet);
        self.wake.notify_one();
    }

    /// A message on the channel: `state epoch ms failures holder`.
    fn heard(&self, message: &str) {
        let parts: Vec<&str> = message.split(' ').collect();
        let [state, epoch, ms, failures, holder] = parts.as_slice() else {
            return;
        };
        let (Ok(epoch), Ok(ms), Ok(failures)) = (epoch.parse(), ms.parse(), failures.parse())
        else {
            return;
        };
        let code = match *state {
            "closed" => 0,
            "open" => 1,
            _ if *holder == self.me => 2,
            _ => 3,
        };
        self.apply((code, epoch, ms, failures));
    }

    /// Subscribes to the channel, then reads the fleet's state (so that nothing published in
    /// between is missed) and adopts it. On a rejoin, a breaker that opened on its own while
    /// the fleet's is closed opens the fleet's for the rest of its cooldown.
    async fn join(&self) -> Result<PubSubStream, Error> {
        let mut last = None;
        let mut subscribed = None;
        for client in self.store.subscribers() {
            match client.get_async_pubsub().await {
                Ok(mut pubsub) => match pubsub.subscribe(&self.key).await {
                    Ok(()) => {
                        subscribed = Some(pubsub);
                        break;
                    }
                    Err(e) => last = Some(e.to_string()),
                },
                Err(e) => last = Some(e.to_string()),
            }
        }
        let pubsub = match (subscribed, last) {
            (Some(pubsub), _) => pubsub,
            (None, Some(e)) => {
                return Err(Error::Store(format!(
                    "shared breaker {:?}: cannot subscribe: {e}",
                    self.name
                )));
            }
            (None, None) => {
                return Err(Error::Config(format!(
                    "breaker {:?}: this RedisStore was made from a connection and knows no \
                     address to subscribe to; make it with RedisStore::connect or \
                     connect_cluster, or name its nodes with subscribing_through",
                    self.name
                )));
            }
        };
        let open_for = self.breaker.retry_in();
        let mut call = SYNC.key(&self.key);
        self.common(&mut call);
        call.arg(self.epoch.load(Ordering::Acquire))
            .arg(millis(open_for));
        let answer = self.run(&call).await?;
        // The fleet's epoch after a rejoin may be one this process has passed (Redis lost its
        // data): it is the one to follow from now on.
        self.epoch.store(answer.1, Ordering::Release);
        self.apply(answer);
        self.attached.store(true, Ordering::Release);
        Ok(pubsub.into_on_message())
    }

    /// Falls back to the local breaker: raised once per loss.
    fn lost(&self, error: &dyn std::fmt::Display) {
        if self.attached.swap(false, Ordering::AcqRel) {
            tell("breaker", &self.name, false, Some(error));
        }
        self.wake.notify_one();
    }

    /// The task of a shared breaker: applies what the fleet publishes, reports successes and
    /// asks for the probe when the cooldown ends; when Redis is lost, tries to rejoin.
    async fn listen(self: Arc<Self>, first: PubSubStream) {
        let mut messages = Some(first);
        let mut wait = REJOIN_FIRST;
        loop {
            let Some(stream) = messages.as_mut().filter(|_| self.attached()) else {
                messages = None;
                tokio::time::sleep(wait).await;
                match self.join().await {
                    Ok(stream) => {
                        messages = Some(stream);
                        wait = REJOIN_FIRST;
                        tell("breaker", &self.name, true, None);
                    }
                    Err(_) => wait = (wait * 2).min(REJOIN_MAX),
                }
                continue;
            };
            let probe_in = self.breaker.probe_in();
            tokio::select! {
                message = next(stream) => match message {
                    Some(message) => {
                        if let Ok(text) = message.get_payload::<String>() {
                            self.heard(&text);
                        }
                    }
                    None => self.lost(&"the subscription to the fleet's channel closed"),
                },
                () = self.wake.notified() => {}
                () = tokio::time::sleep(probe_in.unwrap_or_default()), if probe_in.is_some() => {
                    self.ask_for_the_probe().await;
                }
            }
            if self.attached() && self.success.swap(false, Ordering::AcqRel) {
                self.report_success().await;
            }
        }
    }

    async fn ask_for_the_probe(&self) {
        let mut call = PROBE.key(&self.key);
        self.common(&mut call);
        call.arg(millis(
            self.breaker.cooldown().max(Duration::from_millis(100)),
        ));
        match self.run(&call).await {
            Ok(answer) => self.apply(answer),
            Err(e) => self.lost(&e),
        }
    }

    async fn report_success(&self) {
        let call = self.outcome(&SUCCEEDED);
        match self.run(&call).await {
            Ok(answer) => self.apply(answer),
            Err(e) => self.lost(&e),
        }
    }
}

/// The next message of the subscription; `None` once it closed.
async fn next(stream: &mut PubSubStream) -> Option<redis::Msg> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(1 << 53) as u64
}

/// A shared budget's side of the fleet.
struct BudgetLink {
    budget: &'static RetryBudget,
    store: RedisStore,
    name: String,
    key: String,
    /// Whether the fleet's balance is used (`false`: Redis is out of reach).
    attached: AtomicBool,
}

impl budget::Link for BudgetLink {
    fn attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    fn withdraw(self: Arc<Self>) -> Asking {
        Box::pin(async move {
            match self.hand_over(budget::WITHDRAWAL).await {
                Ok(granted) => granted,
                Err(e) => {
                    self.lost(&e);
                    self.budget.try_withdraw()
                }
            }
        })
    }
}

impl BudgetLink {
    /// Hands the fleet this process's deposits and asks it for `amount` (0: only the hand-over).
    /// `Ok(true)` when the fleet's balance held `amount`, now taken. When Redis cannot be
    /// reached the deposits go back to the local slots.
    async fn hand_over(&self, amount: i64) -> Result<bool, Error> {
        let deposits = self.budget.take_local();
        let slot = self.budget.slot().as_millis() as u64;
        let mut call = WITHDRAW.key(&self.key);
        call.arg(deposits)
            .arg(slot.max(1))
            .arg(budget::SLOTS)
            .arg(self.budget.reserve())
            .arg(amount);
        let reply: redis::RedisResult<i64> = self.store.invoke(&call).await;
        match reply {
            Ok(granted) => Ok(granted == 1),
            Err(e) => {
                self.budget.give_back(deposits);
                Err(Error::Store(format!(
                    "shared retry budget {:?}: {e}",
                    self.name
                )))
            }
        }
    }

    fn lost(&self, error: &dyn std::fmt::Display) {
        if self.attached.swap(false, Ordering::AcqRel) {
            tell("retry_budget", &self.name, false, Some(error));
        }
    }

    /// The task of a shared budget: hands over the deposits once a slot, which also finds
    /// Redis again after a loss. The first hand-over is a slot after the one `share` made.
    async fn flush_every_slot(self: Arc<Self>) {
        let slot = self.budget.slot();
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + slot, slot);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.hand_over(0).await {
                Ok(_) => {
                    if !self.attached.swap(true, Ordering::AcqRel) {
                        tell("retry_budget", &self.name, true, None);
                    }
                }
                Err(e) => self.lost(&e),
            }
        }
    }
}

// What every breaker script starts with. KEYS[1]: the breaker's hash, whose fields are `state`
// (closed, open, half_open), `epoch` (one more at every transition), `until` (open: the end of
// the cooldown; half-open: the end of the probe's lease; in ms of the server's clock), `holder`
// (the process holding the probe), `count` (failures: in a row, or in the windows) and, for a
// failure-rate breaker, `w:<process>` = `calls:failures:ms` (a process's window, when handed
// over). ARGV[1]: the channel; ARGV[2]: this process.
const PRELUDE: &str = r#"
local key, ch, me = KEYS[1], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', key, 'state', 'epoch', 'until', 'holder', 'count')
local state = f[1] or 'closed'
local epoch = tonumber(f[2] or '0')
local till = tonumber(f[3] or '0')
local holder = f[4] or ''
local count = tonumber(f[5] or '0')
local function num(n) return string.format('%d', n) end
local function left()
  if state == 'closed' then return 0 end
  return math.max(till - now, 0)
end
local function windows(stale)
  local calls, failures = 0, 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'w:' then
      local c, n, at = string.match(all[i + 1], '^(%d+):(%d+):(%d+)$')
      if c and now - tonumber(at) <= stale then
        calls = calls + tonumber(c)
        failures = failures + tonumber(n)
      else
        redis.call('HDEL', key, all[i])
      end
    end
  end
  return calls, failures
end
local function hand_over(calls, failures, stale)
  redis.call('HSET', key, 'w:' .. me, calls .. ':' .. failures .. ':' .. num(now))
  local c, n = windows(tonumber(stale))
  count = n
  return c
end
local function publish()
  redis.call('PUBLISH', ch, state .. ' ' .. num(epoch) .. ' ' .. num(left()) .. ' ' ..
    num(count) .. ' ' .. (holder ~= '' and holder or '-'))
end
local function go(to, ms)
  state = to
  epoch = epoch + 1
  count = 0
  holder = ''
  till = 0
  if to == 'half_open' then holder = me end
  if to ~= 'closed' then till = now + ms end
  if to ~= 'half_open' then
    for _, k in ipairs(redis.call('HKEYS', key)) do
      if string.sub(k, 1, 2) == 'w:' then redis.call('HDEL', key, k) end
    end
  end
  redis.call('HSET', key, 'state', state, 'epoch', num(epoch), 'until', num(till),
    'holder', holder, 'count', 0)
  publish()
end
local function answer()
  local code = 0
  if state == 'open' then code = 1
  elseif state == 'half_open' then code = (holder == me) and 2 or 3 end
  return {code, epoch, left(), count}
end
"#;

fn breaker_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

// A transient failure of a call admitted closed. ARGV[3..]: the rule (`c threshold 0` or
// `r ppm min_calls`), this process's window (calls, failures), how long a window counts in ms,
// and the cooldown in ms. Counted only while the fleet's breaker is closed.
static FAILED: LazyLock<Script> = LazyLock::new(|| {
    breaker_script(
        r#"
if state == 'closed' then
  local trips
  if ARGV[3] == 'c' then
    count = redis.call('HINCRBY', key, 'count', 1)
    trips = count >= tonumber(ARGV[4])
  else
    local calls = hand_over(ARGV[6], ARGV[7], ARGV[8])
    redis.call('HSET', key, 'count', count)
    trips = calls >= tonumber(ARGV[5]) and count * 1000000 >= tonumber(ARGV[4]) * calls
  end
  if trips then go('open', tonumber(ARGV[9])) else publish() end
end
return answer()
"#,
    )
});

// Successes since the fleet's count became non-zero. ARGV[3..]: as for a failure, but for the
// cooldown.
static SUCCEEDED: LazyLock<Script> = LazyLock::new(|| {
    breaker_script(
        r#"
if state == 'closed' then
  local was = count
  if ARGV[3] == 'c' then
    count = 0
  else
    hand_over(ARGV[6], ARGV[7], ARGV[8])
  end
  if count ~= was then
    redis.call('HSET', key, 'count', count)
    publish()
  end
end
return answer()
"#,
    )
});

// Asks for the half-open probe: granted when the cooldown is over, or when the last holder's
// lease ended without an outcome. ARGV[3]: the lease in ms.
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    breaker_script(
        r#"
if state ~= 'closed' and now >= till then go('half_open', tonumber(ARGV[3])) end
return answer()
"#,
    )
});

// The probe's outcome. ARGV[3]: the epoch of the half-open state it was admitted in; ARGV[4]:
// 1 closed, 0 re-opened; ARGV[5]: the cooldown in ms.
static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    breaker_script(
        r#"
if state == 'half_open' and holder == me and epoch == tonumber(ARGV[3]) then
  if ARGV[4] == '1' then go('closed', 0) else go('open', tonumber(ARGV[5])) end
end
return answer()
"#,
    )
});

// Joining: the fleet's epoch is raised to this process's (Redis may have lost the hash), and a
// closed fleet opens for ARGV[4] ms when this process opened on its own meanwhile (0: it did
// not). ARGV[3]: the last epoch this process applied.
static SYNC: LazyLock<Script> = LazyLock::new(|| {
    breaker_script(
        r#"
if tonumber(ARGV[3]) > epoch then epoch = tonumber(ARGV[3]) end
redis.call('HSET', key, 'state', state, 'epoch', num(epoch))
if state == 'closed' and tonumber(ARGV[4]) > 0 then go('open', tonumber(ARGV[4])) end
return answer()
"#,
    )
});

// KEYS[1]: the budget's hash, one field `t<slot>` per slot of the server's clock with its
// balance in thousandths of a retry. ARGV: the deposits handed over, the slot in ms, the slots
// in a window, the floor, the amount asked for (0: none). Returns 1 when the amount was taken.
static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slot_ms, slots = tonumber(ARGV[2]), tonumber(ARGV[3])
local tick = math.floor(now / slot_ms)
local field = 't' .. string.format('%d', tick)
local deposits, amount = tonumber(ARGV[1]), tonumber(ARGV[5])
if deposits ~= 0 then redis.call('HINCRBY', key, field, deposits) end
local balance = tonumber(ARGV[4])
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local s = tonumber(string.sub(all[i], 2))
  if s and tick - s < slots then
    balance = balance + tonumber(all[i + 1])
  else
    redis.call('HDEL', key, all[i])
  end
end
local granted = 0
if amount > 0 and balance >= amount then
  redis.call('HINCRBY', key, field, -amount)
  granted = 1
end
redis.call('PEXPIRE', key, slot_ms * (slots + 1))
return granted
"#,
    )
});
