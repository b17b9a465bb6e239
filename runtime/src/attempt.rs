//! The attempt in the body: which attempt of a guarded call is running, read from inside it.
//!
//! [`attempt()`] answers anywhere inside a call guarded by `#[retry]`, `#[idempotent]` or
//! [`Policy::run`](crate::Policy::run), and `None` outside one. A job runner puts its own
//! delivery count in scope with [`Delivery::scope`], and the attempt carries it.
//!
#![cfg_attr(feature = "macros", doc = "```")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! #[jobguard::retry(attempts = 3, base = "0ms", cap = "0ms", on = all)]
//! async fn fetch() -> Result<u32, std::io::Error> {
//!     let attempt = jobguard::attempt().expect("inside a guarded call");
//!     match attempt.number {
//!         1 | 2 => Err(std::io::ErrorKind::ConnectionReset.into()),
//!         n => Ok(n),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! assert_eq!(fetch().await.unwrap(), 3);
//! assert!(jobguard::attempt().is_none());
//! # }
//! ```

use std::cell::Cell;
use std::future::Future;
use tokio::time::Instant;

/// One attempt of a guarded call, as [`attempt()`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt's number within this call, from 1.
    pub number: u32,
    /// The job runner's delivery this call runs in, when one is in scope ([`Delivery::scope`]).
    pub delivery: Option<Delivery>,
    /// When the attempt started, on tokio's clock (so a paused test clock drives it), to within
    /// the poll that started it: an attempt that asks during its first poll reads the clock then.
    pub started: Instant,
    /// The generation of the idempotency claim the body runs under, as [`fence()`] gives it.
    pub fence: Option<u64>,
}

/// One delivery of a job by a job runner: the broker's count, not the retry loop's.
///
/// A runner integration puts it in scope around the job with [`Delivery::scope`]; the job reads
/// it as [`Attempt::delivery`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The delivery's number, from 1.
    pub number: u32,
    /// Whether the runner will not deliver the job again after this one.
    pub last: bool,
}

/// What the delivery scope holds: the delivery, and whether a dead letter was written in it.
struct Scoped {
    delivery: Delivery,
    dead_lettered: Cell<bool>,
}

tokio::task_local! {
    static DELIVERY: Scoped;
}

impl Delivery {
    /// Runs `fut` with this delivery in scope: every guarded call inside it, on this task, sees it
    /// in [`Attempt::delivery`].
    ///
    #[cfg_attr(feature = "macros", doc = "```")]
    #[cfg_attr(not(feature = "macros"), doc = "```ignore")]
    /// use jobguard::Delivery;
    ///
    /// #[jobguard::retry(attempts = 1)]
    /// async fn job() -> Result<Option<Delivery>, std::io::Error> {
    ///     Ok(jobguard::attempt().and_then(|a| a.delivery))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let delivery = Delivery { number: 2, last: false };
    /// assert_eq!(delivery.scope(job()).await.unwrap(), Some(delivery));
    /// # }
    /// ```
    pub fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        DELIVERY.scope(self.scoped(), fut)
    }

    /// [`Delivery::scope`], also telling whether a guarded call inside `fut` settled the job:
    /// it wrote a dead letter during this delivery, found its job dead-lettered before (a
    /// poisoned job, refused with [`Error::Poisoned`](crate::Error::Poisoned)), or was refused
    /// in a way no redelivery can change while the key's record stands (a key another job's
    /// arguments completed, [`Error::KeyReused`](crate::Error::KeyReused) against a completed
    /// record, not a live claim, which may yet be released; a result that could not be kept,
    /// [`Error::Unreplayable`](crate::Error::Unreplayable)). A runner integration then knows
    /// the job must not be delivered again, whatever `fut` returned (one job, one dead letter).
    ///
    /// An exhausted `#[retry]` on a delivery that is not the [`last`](Delivery::last) writes no
    /// letter; it hands its error back for the runner to deliver the job again.
    ///
    #[cfg_attr(feature = "macros", doc = "```")]
    #[cfg_attr(not(feature = "macros"), doc = "```ignore")]
    /// use jobguard::Delivery;
    ///
    /// #[jobguard::retry(attempts = 2, base = "0ms", cap = "0ms", on = all)]
    /// async fn job() -> Result<(), std::io::Error> {
    ///     Err(std::io::ErrorKind::ConnectionReset.into())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // Delivery 1 of 3: the error is handed back, no letter.
    /// let (result, dead_lettered) = Delivery { number: 1, last: false }.scope_settled(job()).await;
    /// assert!(result.is_err() && !dead_lettered);
    /// // Delivery 3 of 3: the letter is written (to the runtime's sink).
    /// let (result, dead_lettered) = Delivery { number: 3, last: true }.scope_settled(job()).await;
    /// assert!(result.is_err() && dead_lettered);
    /// # }
    /// ```
    pub fn scope_settled<F: Future>(self, fut: F) -> impl Future<Output = (F::Output, bool)> {
        DELIVERY.scope(self.scoped(), async move {
            let output = fut.await;
            let dead_lettered = DELIVERY
                .try_with(|s| s.dead_lettered.get())
                .unwrap_or(false);
            (output, dead_lettered)
        })
    }

    fn scoped(self) -> Scoped {
        Scoped {
            delivery: self,
            dead_lettered: Cell::new(false),
        }
    }

    /// The delivery in scope on this task, if any.
    pub fn current() -> Option<Delivery> {
        DELIVERY.try_with(|s| s.delivery).ok()
    }

    /// Notes that the job of the delivery in scope, if any, is settled: its one dead letter was
    /// taken by the sink now (a give-up; a letter the sink refused settles nothing) or before (a
    /// poisoned job's refusal), or its key refuses it for good (a key completed with other arguments, an unreplayable
    /// result), so it must not be delivered again.
    pub(crate) fn settle() {
        let _ = DELIVERY.try_with(|s| s.dead_lettered.set(true));
    }
}

/// The attempt of the guarded call running on this thread, if any.
///
/// `None` outside a guarded call. Inside one, the attempt's number (from 1), the delivery in
/// scope, and when the attempt started.
pub fn attempt() -> Option<Attempt> {
    // Asked during the attempt's first poll: it started in this poll.
    let (number, started) = learn(|learned| *learned.started.get_or_insert_with(Instant::now))?;
    Some(Attempt {
        number,
        delivery: Delivery::current(),
        started,
        fence: fence(),
    })
}

/// What the engine keeps of a running attempt between polls, and puts in scope on the polling
/// thread while its body is polled ([`poll_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InBody {
    /// The attempt's number, from 1; 0 outside an attempt.
    pub(crate) number: u32,
    /// What the body learned by asking, kept for its later polls: `None` until it asks.
    pub(crate) learned: Option<Learned>,
}

impl InBody {
    /// Outside every attempt.
    pub(crate) const NONE: InBody = InBody::numbered(0);

    /// Attempt `number`, which has learned nothing yet.
    pub(crate) const fn numbered(number: u32) -> InBody {
        InBody {
            number,
            learned: None,
        }
    }

    /// The attempt's start, if known.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.learned.and_then(|learned| learned.started)
    }
}

/// What an attempt's body learns by asking: its start, its serial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Learned {
    /// The attempt's start, once known: read when the body first asks, or given by the engine.
    pub(crate) started: Option<Instant>,
    /// The attempt's serial, once a durable step asked for it ([`run()`]); 0 until then.
    pub(crate) run: u64,
}

/// Set in [`CURRENT`] beside the attempt's number when [`LEARNED`] holds what it learned.
const HAS_LEARNED: u64 = 1 << 32;

thread_local! {
    /// The attempt whose body is being polled on this thread: its number in the low 32 bits
    /// (0 when no attempt's body is), and [`HAS_LEARNED`]. One word, because it is swapped on
    /// every poll of every guarded call; what an attempt learned is rarely asked for, and sits
    /// in a cell of its own.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
    /// What that attempt learned, when [`CURRENT`] has [`HAS_LEARNED`].
    static LEARNED: Cell<Learned> = const { Cell::new(Learned { started: None, run: 0 }) };
    /// The generation of the claim whose body is being polled on this thread; [`NO_FENCE`] when
    /// none is (or its store does not number claims).
    static FENCE: Cell<u64> = const { Cell::new(NO_FENCE) };
}

/// Lets `learn` read and add to what the attempt whose body is being polled on this thread
/// learned; returns the attempt's number and what `learn` returned, or `None` outside an
/// attempt.
fn learn<R>(learn: impl FnOnce(&mut Learned) -> R) -> Option<(u32, R)> {
    let current = CURRENT.get();
    let number = current as u32;
    if number == 0 {
        return None;
    }
    let mut learned = match current & HAS_LEARNED {
        0 => Learned::default(),
        _ => LEARNED.get(),
    };
    let answer = learn(&mut learned);
    LEARNED.set(learned);
    CURRENT.set(current | HAS_LEARNED);
    Some((number, answer))
}

/// No claim's body is being polled, or its store gave generation 0.
const NO_FENCE: u64 = 0;

/// The fencing token of the idempotent call whose body is running: the generation of the claim
/// it holds. `None` outside an idempotent call, and under a store that gives its claims
/// generation 0 (does not number them).
///
/// Every claim of a key gets a generation one larger than the claim before it, and a claim that
/// takes over an abandoned one (its lease lapsed) is a new claim. So the generation orders the
/// workers that ever held the key: a larger one always came later. Pass it to the systems the
/// body writes to.
///
/// # Why a lease is not enough
///
/// Martin Kleppmann's paused process ("How to do distributed locking", 2016): worker A claims
/// the job with a 30 s lease and starts it. Then A stops dead: a stop-the-world garbage
/// collection, a VM live-migrated or stalled by its host, a laptop lid closed, a process
/// stopped with `SIGSTOP`, a page fault on a swapped-out heap. The pause outlasts the lease, so
/// the store gives the key to worker B, which runs the job and writes its effect. Then A wakes
/// up. From where A stands nothing happened between two instructions: it believes it still holds
/// the key and writes its effect too, over B's or beside it.
///
/// A lease cannot stop that write. A could check its lease just before writing, and the pause
/// can fall between the check and the write; renewals and clocks do not help either, because
/// the paused process does not run at all. jobguard sees it only afterwards: A's
/// [`complete`](crate::Store::complete) fails with [`Error::LeaseLost`](crate::Error::LeaseLost),
/// but the write has been made.
///
/// What stops it is the one system that receives both writes: the downstream. It remembers the
/// largest fence it has seen for the key and refuses a write that carries a smaller one. B's
/// claim came after A's, so B's fence is larger; once B has written, A's late write carries the
/// smaller fence and is refused (and if A's write comes first, B's still goes through). The check
/// and the write must be one atomic step in the downstream: a conditional `UPDATE ... WHERE fence
/// <= $1`, a Lua script in Redis, a compare-and-set.
///
#[cfg_attr(feature = "macros", doc = "```")]
#[cfg_attr(not(feature = "macros"), doc = "```ignore")]
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// /// A downstream that keeps, per order, the largest fence it has seen and refuses older ones.
/// #[derive(Default)]
/// struct Ledger {
///     orders: Mutex<HashMap<String, (u64, u64)>>, // order -> (largest fence, amount charged)
/// }
///
/// impl Ledger {
///     fn charge(&self, order: &str, fence: u64, amount: u64) -> Result<(), jobguard::Error> {
///         let mut orders = self.orders.lock().unwrap();
///         let (seen, charged) = orders.entry(order.to_owned()).or_default();
///         if fence < *seen {
///             return Err(jobguard::Error::LeaseLost); // a newer claim has written: refuse
///         }
///         *seen = fence;
///         *charged = amount;
///         Ok(())
///     }
/// }
///
/// #[jobguard::idempotent(key = order)]
/// async fn charge(ledger: &Ledger, order: &str) -> Result<(), jobguard::Error> {
///     let fence = jobguard::fence().expect("the default store numbers its claims");
///     ledger.charge(order, fence, 100)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let ledger = Ledger::default();
/// charge(&ledger, "order-A").await.unwrap();
/// // A worker that paused with generation 0 wakes up and writes: refused.
/// assert!(ledger.charge("order-A", 0, 100).is_err());
/// assert!(jobguard::fence().is_none()); // outside an idempotent call
/// # }
/// ```
///
/// The fence is read on the task that polls the body, at any depth (inside a `#[retry]` under
/// the `#[idempotent]` too), but not on a task the body spawns: pass the value on.
pub fn fence() -> Option<u64> {
    match FENCE.get() {
        NO_FENCE => None,
        generation => Some(generation),
    }
}

/// Polls `poll` with `body` as the attempt in the body, and keeps in `body` what the body
/// learned by asking. The attempt outside (a guarded call inside another) is put back
/// afterwards, also when `poll` panics.
///
/// Marked `#[inline]`, with its `Restore`'s drop: it runs on every poll of every guarded call, in
/// the caller's crate, where a function of this crate that is not generic is otherwise a call
/// (`suite/benches/retry_calls.rs` at 2d3b789: 279 instructions a `#[retry]` call without, 245
/// with).
#[inline]
pub(crate) fn poll_in<R>(body: &mut InBody, poll: impl FnOnce() -> R) -> R {
    /// Puts the attempt outside back, and keeps what this one learned.
    struct Restore<'s> {
        outside: u64,
        body: &'s mut InBody,
    }
    impl Drop for Restore<'_> {
        #[inline]
        fn drop(&mut self) {
            if CURRENT.replace(self.outside) & HAS_LEARNED != 0 {
                self.body.learned = Some(LEARNED.get());
            }
        }
    }
    /// Puts back what the attempt outside learned: this poll may use its cell.
    struct PutBack(Learned);
    impl Drop for PutBack {
        fn drop(&mut self) {
            LEARNED.set(self.0);
        }
    }
    let mut current = u64::from(body.number);
    if body.learned.is_some() {
        current |= HAS_LEARNED;
    }
    let outside = CURRENT.replace(current);
    let _put_back = (outside & HAS_LEARNED != 0).then(|| PutBack(LEARNED.get()));
    if let Some(learned) = body.learned {
        LEARNED.set(learned);
    }
    let _restore = Restore { outside, body };
    poll()
}

/// The serial of the attempt whose body is being polled on this thread: a number no other
/// attempt in the process has, handed out the first time it is asked for. 0 outside an
/// attempt. What a durable step counts its occurrences within: one run of the job's body.
pub(crate) fn run() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let serial = learn(|learned| {
        if learned.run == 0 {
            learned.run = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        learned.run
    });
    serial.map_or(0, |(_, serial)| serial)
}

pin_project_lite::pin_project! {
    /// A future polled as attempt 1 of a guarded call: the body of an `#[idempotent]` job
    /// without `#[retry]`. A `#[retry]` inside numbers its own attempts.
    pub(crate) struct FirstAttempt<F> {
        body: InBody,
        #[pin]
        future: F,
    }
}

impl<F> FirstAttempt<F> {
    pub(crate) fn new(future: F) -> Self {
        FirstAttempt {
            body: InBody::numbered(1),
            future,
        }
    }
}

impl<F: Future> Future for FirstAttempt<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        poll_in(this.body, || future.poll(cx))
    }
}

pin_project_lite::pin_project! {
    /// A future polled as the body of the claim of generation `generation`: [`fence()`] gives it.
    pub(crate) struct Fenced<F> {
        generation: u64,
        #[pin]
        future: F,
    }
}

impl<F> Fenced<F> {
    pub(crate) fn new(generation: u64, future: F) -> Self {
        Fenced { generation, future }
    }
}

impl<F: Future> Future for Fenced<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        /// Puts the fence outside back, also when the body panics.
        struct Restore(u64);
        impl Drop for Restore {
            fn drop(&mut self) {
                FENCE.set(self.0);
            }
        }
        let this = self.project();
        let _restore = Restore(FENCE.replace(*this.generation));
        this.future.poll(cx)
    }
}
