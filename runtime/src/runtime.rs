//! Runtime configuration: the dead-letter sink, the observer, the jitter seed (and, with
//! `#[idempotent]`, the store) that attributes use when they are not given one.

use crate::dead_letter::{DeadLetterSink, LogDeadLetters};
use crate::observe::Observer;
use crate::store::Store;
use crate::store::memory::MemoryStore;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

/// The configuration jobs run under.
///
/// A job uses, in order: the runtime of the enclosing [`Runtime::scope`], else the one made the
/// process default with [`Runtime::install`], else the embedded default (a process-wide
/// [`MemoryStore`], dead letters written to the log and kept in memory, no observer,
/// entropy-seeded jitter). A built runtime takes the embedded default for every part not set,
/// so runtimes built without `.store(..)` share the one process-wide `MemoryStore`. `Clone` shares one runtime.
///
/// ```
/// use jobguard::{MemoryDeadLetters, Runtime};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let letters = MemoryDeadLetters::new();
/// let runtime = Runtime::builder().dead_letters(letters.clone()).seed(7).build();
/// runtime.scope(async { /* jobs here send their give-ups to `letters` */ }).await;
/// # }
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The claims that jobs and requests under this runtime hold now (see
    /// [`Runtime::shutdown`]).
    pub(crate) held: Held,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) dead_letters: Arc<dyn DeadLetterSink>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    seed: Option<u64>,
    draws: AtomicU64,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("seed", &self.inner.seed)
            .finish_non_exhaustive()
    }
}

/// The claims held under one runtime: counted from the claim until its completion or release is
/// written (a claim dropped with its work counts until the release task is done).
#[derive(Default)]
pub(crate) struct Held {
    count: std::sync::atomic::AtomicUsize,
    none_left: tokio::sync::Notify,
}

/// One claim counted in its runtime's [`Held`]; uncounted when dropped.
pub(crate) struct HeldClaim {
    runtime: Runtime,
}

impl HeldClaim {
    pub(crate) fn new(runtime: &Runtime) -> Self {
        runtime.inner.held.count.fetch_add(1, Ordering::AcqRel);
        HeldClaim {
            runtime: runtime.clone(),
        }
    }
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        let held = &self.runtime.inner.held;
        if held.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            held.none_left.notify_waiters();
        }
    }
}

/// Builds a [`Runtime`]; see [`Runtime::builder`].
#[must_use]
pub struct RuntimeBuilder {
    store: Option<Arc<dyn Store>>,
    dead_letters: Option<Arc<dyn DeadLetterSink>>,
    observer: Option<Arc<dyn Observer>>,
    seed: Option<u64>,
}

impl RuntimeBuilder {
    /// The idempotency store for `#[idempotent]` jobs without `store = ...`. Default: one
    /// process-wide [`MemoryStore`].
    pub fn store<S: Store + 'static>(mut self, store: S) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The sink for give-ups of jobs without `dead_letter = ...`.
    pub fn dead_letters<D: DeadLetterSink + 'static>(mut self, sink: D) -> Self {
        self.dead_letters = Some(Arc::new(sink));
        self
    }

    /// The observer for every event.
    pub fn observer<O: Observer + 'static>(mut self, observer: O) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Seeds jitter, so that a run's delays are reproducible. Jobs draw in the order they first
    /// retry; one job's draws are one stream.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The runtime.
    pub fn build(self) -> Runtime {
        if self.observer.is_some() {
            crate::observe::note_observer(|event| Current::get().emit(event));
        }
        Runtime {
            inner: Arc::new(Inner {
                held: Held::default(),
                store: self.store.unwrap_or_else(|| EMBEDDED_STORE.clone()),
                dead_letters: self
                    .dead_letters
                    .unwrap_or_else(|| Arc::new(LogDeadLetters::new())),
                observer: self.observer,
                seed: self.seed,
                draws: AtomicU64::new(0),
            }),
        }
    }
}

/// The runtime in scope, borrowed when it is the installed or the embedded one (no reference
/// count is touched), owned when it comes from a [`Runtime::scope`], whose task-local value
/// cannot be borrowed past the lookup.
pub(crate) enum Current {
    Static(&'static Runtime),
    Scoped(Runtime),
}

impl Current {
    /// The runtime a job started here would use.
    #[inline]
    pub(crate) fn get() -> Current {
        Current::with_installed(Current::installed())
    }

    /// The installed runtime, if there is one yet: what a job fixes when it starts, so that an
    /// `install()` while it runs does not move it to another runtime halfway.
    #[inline]
    pub(crate) fn installed() -> Option<&'static Runtime> {
        INSTALLED.get()
    }

    /// The runtime in scope, else `installed` as read when the job started, else the embedded one.
    #[inline]
    pub(crate) fn with_installed(installed: Option<&'static Runtime>) -> Current {
        let outside = || Current::Static(installed.unwrap_or(&EMBEDDED));
        if !IN_SCOPE.get() {
            return outside();
        }
        SCOPED
            .try_with(|scoped| Current::Scoped(scoped.clone()))
            .unwrap_or_else(|_| outside())
    }

    /// Whether the runtime a job started here would use has an observer: what [`Current::get`]
    /// would tell, without taking a handle on the runtime.
    pub(crate) fn observed() -> bool {
        if IN_SCOPE.get()
            && let Ok(observed) = SCOPED.try_with(|scoped| scoped.observer().is_some())
        {
            return observed;
        }
        // The embedded runtime has no observer.
        INSTALLED
            .get()
            .is_some_and(|installed| installed.observer().is_some())
    }

    /// An owned handle on the runtime.
    pub(crate) fn to_owned(&self) -> Runtime {
        Runtime::clone(self)
    }
}

impl std::ops::Deref for Current {
    type Target = Runtime;

    #[inline]
    fn deref(&self) -> &Runtime {
        match self {
            Current::Static(runtime) => runtime,
            Current::Scoped(runtime) => runtime,
        }
    }
}

tokio::task_local! {
    static SCOPED: Runtime;
}

thread_local! {
    /// Whether a [`Runtime::scope`] is being polled on this thread: a call outside every scope
    /// (most of them) then skips the task-local lookup.
    static IN_SCOPE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pin_project_lite::pin_project! {
    /// The future of [`Runtime::scope`]: `fut` with the runtime in scope, and [`IN_SCOPE`] set
    /// while it is polled.
    struct InScope<F> {
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        /// Puts the flag back, also when `fut` panics.
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                IN_SCOPE.set(self.0);
            }
        }
        let _restore = Restore(IN_SCOPE.replace(true));
        self.project().fut.poll(cx)
    }
}

static INSTALLED: OnceLock<Runtime> = OnceLock::new();
static EMBEDDED_STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| Arc::new(MemoryStore::new()));
static EMBEDDED: LazyLock<Runtime> = LazyLock::new(|| Runtime::builder().build());

impl Runtime {
    /// A builder with nothing set: every part defaults to the embedded one.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            store: None,
            dead_letters: None,
            observer: None,
            seed: None,
        }
    }

    /// Makes this runtime the process default. The first install wins: a second one is refused
    /// and hands its runtime back.
    pub fn install(self) -> Result<(), Runtime> {
        INSTALLED.set(self)
    }

    /// Runs `fut` with this runtime in scope: every job it calls, on this task, uses it. Tests
    /// use this to give each case its own sinks, observer and seed.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        InScope {
            fut: SCOPED.scope(self.clone(), fut),
        }
        .await
    }

    /// The runtime a job started here would use.
    pub fn current() -> Runtime {
        Current::get().to_owned()
    }

    /// How many idempotency claims jobs and requests under this runtime hold now: claimed, and
    /// neither completed nor released yet.
    pub fn held_claims(&self) -> usize {
        self.inner.held.count.load(Ordering::Acquire)
    }

    /// Waits, up to `grace`, until no job or request under this runtime holds a claim: the
    /// part of a graceful shutdown that jobguard owns. `Ok(())` once none is held; `Err(n)`
    /// with the claims still held when `grace` ran out.
    ///
    /// Stop taking work first (a job runner's own stop, such as apalis's `run_until`), give the
    /// work in flight its grace period, then drop what is still running: a dropped job's claim
    /// is released (its work runs again on another delivery, and no crash is counted), and this
    /// waits for those releases to be written. A process that exits with a claim still held
    /// leaves it to lapse with its lease, and the next claimer counts that as a crash.
    ///
    /// ```no_run
    /// # async fn run_worker() -> Result<(), std::io::Error> { Ok(()) }
    /// # #[tokio::main]
    /// # async fn main() {
    /// use std::time::Duration;
    ///
    /// let runtime = jobguard::Runtime::builder().build();
    /// runtime.clone().install().expect("the first runtime installed");
    /// // The worker stops taking jobs on SIGTERM and lets those in flight finish for 20 s; at
    /// // its end, whatever still runs is dropped, and its claims are released.
    /// let stopped = tokio::time::timeout(Duration::from_secs(20), run_worker()).await;
    /// // Wait for those releases before the process exits.
    /// if let Err(held) = runtime.shutdown(Duration::from_secs(5)).await {
    ///     eprintln!("{held} claims left to lapse with their lease");
    /// }
    /// # let _ = stopped;
    /// # }
    /// ```
    pub async fn shutdown(&self, grace: Duration) -> Result<(), usize> {
        let held = &self.inner.held;
        let none_left = async {
            loop {
                let notified = held.none_left.notified();
                if held.count.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(grace, none_left).await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.held_claims()),
        }
    }

    /// The idempotency store for jobs without `store = ...`.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The sink for give-ups of jobs without `dead_letter = ...`.
    pub fn dead_letters(&self) -> &Arc<dyn DeadLetterSink> {
        &self.inner.dead_letters
    }

    /// The observer, when one was set.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.inner.observer.as_ref()
    }

    /// Sends `event` to the observer, and to the `metrics` and `tracing` integrations when those
    /// features are on. Every event the runtime raises goes through here.
    #[inline]
    pub(crate) fn emit(&self, event: &crate::observe::Event<'_>) {
        self.emit_job(event, None);
    }

    /// [`Runtime::emit`], for an event of a job whose name is known statically.
    #[inline]
    pub(crate) fn emit_job(
        &self,
        event: &crate::observe::Event<'_>,
        job: Option<&'static crate::observe::Job>,
    ) {
        if let Some(observer) = &self.inner.observer {
            observer.on_event(event);
        }
        crate::observe::record_job(event, job);
    }

    /// A fresh random stream for one job's jitter: seeded from the runtime's seed and the number
    /// of streams handed out before, or from entropy when there is no seed.
    pub(crate) fn rng(&self) -> SmallRng {
        match self.inner.seed {
            Some(seed) => {
                let n = self.inner.draws.fetch_add(1, Ordering::Relaxed);
                SmallRng::seed_from_u64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            }
            None => SmallRng::from_rng(&mut rand::rng()),
        }
    }
}
