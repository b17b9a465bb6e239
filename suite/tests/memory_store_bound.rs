//! `MemoryStore` within its bound: the embedded default keeps working at any number of jobs,
//! gives up only old completed records (counted, raised as events), never a live claim or a
//! record younger than `min_retention`, and fails closed only when nothing can be given up.

use jobguard::store::memory::{DEFAULT_MAX_BYTES, DEFAULT_MIN_RETENTION};
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Error, Event, MemoryStore, Runtime, Store, StoreKey};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Times the body of [`job`] ran.
static RAN: AtomicU64 = AtomicU64::new(0);

#[jobguard::idempotent(key = id, scope = "tests.memory_store_bound.job")]
async fn job(id: u64) -> Result<u64, Error> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(id * 2)
}

/// Times the body of [`scoped_job`] ran.
static SCOPED_RAN: AtomicU64 = AtomicU64::new(0);

#[jobguard::idempotent(key = id, scope = "tests.memory_store_bound.scoped")]
async fn scoped_job(id: u64) -> Result<u64, Error> {
    SCOPED_RAN.fetch_add(1, Ordering::Relaxed);
    Ok(id + 1)
}

#[tokio::test]
async fn half_a_million_distinct_jobs_on_the_embedded_default() {
    const JOBS: u64 = 500_000;
    for id in 0..JOBS {
        assert_eq!(job(id).await, Ok(id * 2), "job {id}");
        if id % 1_000 == 0 {
            // A redelivery right after it ran replays.
            assert_eq!(job(id).await, Ok(id * 2), "redelivery of {id}");
        }
    }
    assert_eq!(RAN.load(Ordering::Relaxed), JOBS, "no job ran twice");
    // Every job completed within the floor, so every redelivery replays, the first ones too.
    for id in (0..JOBS).step_by(997) {
        assert_eq!(job(id).await, Ok(id * 2), "late redelivery of {id}");
    }
    assert_eq!(RAN.load(Ordering::Relaxed), JOBS, "no job ran twice");
    assert_eq!(DEFAULT_MIN_RETENTION, Duration::from_secs(3600));
}

fn key(key: &str) -> StoreKey<'_> {
    StoreKey {
        scope: "bound",
        key,
    }
}

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_store_full_of_live_claims_fails_closed_replays_and_recovers() {
    let store = MemoryStore::builder().max_bytes(64 * 1024).build();
    assert_eq!(
        store.claim_plain(key("done"), "t", None, LEASE).await,
        Ok(Claim::Acquired)
    );
    store
        .complete(key("done"), "t", b"result", Duration::from_secs(24 * 3600))
        .await
        .unwrap();

    // Live claims, until one is refused.
    let mut held = Vec::new();
    let words = loop {
        let k = format!("claim-{}", held.len());
        match store.claim_plain(key(&k), "t", None, LEASE).await {
            Ok(Claim::Acquired) => held.push(k),
            Err(Error::Store(words)) => break words,
            other => panic!("{other:?}"),
        }
        assert!(held.len() < 100_000, "never full: {:?}", store.stats());
    };
    assert!(words.contains("memory store full"), "{words}");
    assert!(words.contains("live claims"), "{words}");
    assert!(words.contains("max_bytes"), "{words}");
    assert!(store.stats().bytes <= 64 * 1024, "{:?}", store.stats());
    assert_eq!(store.stats().evicted, 0, "no live claim is given up");

    // Still refused, closed, through the attribute: the body does not run.
    let runtime = Runtime::builder().store(store.clone()).build();
    let mut refused = 0;
    for id in 0..50 {
        if let Err(Error::Store(_)) = runtime.scope(scoped_job(id)).await {
            refused += 1;
        }
    }
    assert!(refused > 0);
    assert_eq!(SCOPED_RAN.load(Ordering::Relaxed), 50 - refused);

    // Every claim held is still held, and the completed key replays.
    for k in &held {
        assert!(matches!(
            store.claim_plain(key(k), "other", None, LEASE).await,
            Ok(Claim::InProgress { .. })
        ));
    }
    assert_eq!(
        store.claim_plain(key("done"), "u", None, LEASE).await,
        Ok(Claim::Completed(b"result".to_vec()))
    );

    // Once the leases lapse, the store makes room by itself: as many jobs as there were claims
    // held can claim (and, failing, release) their keys.
    tokio::time::advance(LEASE).await;
    for i in 0..held.len() {
        let k = format!("after-{i}");
        assert_eq!(
            store.claim_plain(key(&k), "t", None, LEASE).await,
            Ok(Claim::Acquired),
            "{i}: {:?}",
            store.stats()
        );
        store.release(key(&k), "t").await.unwrap();
    }
    assert!(store.stats().expired > 0);
    assert_eq!(
        store.claim_plain(key("done"), "u", None, LEASE).await,
        Ok(Claim::Completed(b"result".to_vec()))
    );
}

#[tokio::test(start_paused = true)]
async fn under_pressure_old_records_go_counted_and_redeliveries_within_the_floor_replay() {
    const JOBS: u64 = 5_000;
    let floor = Duration::from_secs(10);
    let store = MemoryStore::builder()
        .max_bytes(256 * 1024)
        .min_retention(floor)
        .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let runtime = Runtime::builder()
        .store(store.clone())
        .observer(move |e: &Event<'_>| {
            if let Event::Evicted {
                store,
                records,
                youngest,
                oldest,
            } = *e
            {
                seen.lock()
                    .unwrap()
                    .push((store.to_owned(), records, youngest, oldest));
            }
        })
        .build();
    let ran = Arc::new(AtomicU64::new(0));
    let run = |id: u64| {
        let ran = ran.clone();
        let store = store.clone();
        async move {
            let token = format!("t{id}");
            let k = id.to_string();
            match store.claim_plain(key(&k), &token, None, LEASE).await? {
                Claim::Acquired => {
                    ran.fetch_add(1, Ordering::Relaxed);
                    store
                        .complete(key(&k), &token, &[1; 64], Duration::from_secs(24 * 3600))
                        .await?;
                    Ok::<bool, Error>(true)
                }
                Claim::Completed(_) => Ok(false),
                other => panic!("{other:?}"),
            }
        }
    };
    // One job every 100 ms: the floor covers the last 100 jobs, far under the bound.
    for id in 0..JOBS {
        assert_eq!(runtime.scope(run(id)).await, Ok(true), "job {id}");
        if id >= 90 {
            // A redelivery of a job that completed 9 s ago replays.
            assert_eq!(runtime.scope(run(id - 90)).await, Ok(false), "{id}");
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ran.load(Ordering::Relaxed),
        JOBS,
        "none ran twice, none failed"
    );
    let stats = store.stats();
    assert!(stats.evicted > 0, "{stats:?}");
    assert!(stats.bytes <= stats.max_bytes, "{stats:?}");
    assert!(stats.records < JOBS as usize, "{stats:?}");
    let events = std::mem::take(&mut *events.lock().unwrap());
    assert_eq!(
        events.iter().map(|e| e.1).sum::<u64>(),
        stats.evicted,
        "every eviction raised"
    );
    for (name, _, youngest, oldest) in events.iter() {
        assert_eq!(name, "memory");
        assert!(
            *youngest >= floor && oldest >= youngest,
            "{youngest:?} {oldest:?}"
        );
    }
    // The oldest jobs were the ones given up: the first runs again, the last replays.
    assert_eq!(runtime.scope(run(0)).await, Ok(true));
    assert_eq!(runtime.scope(run(JOBS - 1)).await, Ok(false));
}

#[test]
fn the_default_bound_is_in_the_hundreds_of_mib() {
    assert_eq!(DEFAULT_MAX_BYTES, 256 << 20);
    let stats = MemoryStore::new().stats();
    assert_eq!(stats.max_bytes, DEFAULT_MAX_BYTES);
    assert_eq!((stats.records, stats.evicted, stats.expired), (0, 0, 0));
}

/// A bound too small for one record refuses every claim saying so, not that the store is full
/// of records it does not hold.
#[tokio::test]
async fn a_bound_too_small_for_one_record_says_so() {
    // 64 bytes a shard: a record alone counts more (see the store's module docs).
    let store = MemoryStore::builder()
        .max_bytes(1024)
        .min_retention(Duration::ZERO)
        .build();
    let key = StoreKey {
        scope: "tests.memory_store_bound.tiny",
        key: "k",
    };
    match store
        .claim_plain(key, "t", None, Duration::from_secs(30))
        .await
    {
        Err(Error::Store(msg)) => {
            assert!(msg.contains("bound too small"), "{msg}");
            assert!(msg.contains("max_bytes"), "{msg}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(store.is_empty());
}

/// What the allocator holds for this thread's blocks, while counting is on: glibc's usable size
/// of each block and its 8-byte header, read from the allocator rather than modelled.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod held {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Held;

    thread_local! {
        static ON: Cell<bool> = const { Cell::new(false) };
        static BYTES: Cell<isize> = const { Cell::new(0) };
    }

    unsafe extern "C" {
        fn malloc_usable_size(ptr: *mut u8) -> usize;
    }

    fn note(ptr: *mut u8, sign: isize) {
        if ptr.is_null() || !ON.try_with(Cell::get).unwrap_or(false) {
            return;
        }
        // SAFETY: `ptr` is a live block of the system allocator (glibc's malloc).
        let size = unsafe { malloc_usable_size(ptr) } as isize + 8;
        let _ = BYTES.try_with(|b| b.set(b.get() + sign * size));
    }

    // SAFETY: every call is forwarded unchanged to the system allocator; counting reads the
    // block's size and touches only const-initialised thread-locals, which never allocate.
    unsafe impl GlobalAlloc for Held {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let ptr = unsafe { System.alloc(layout) };
            note(ptr, 1);
            ptr
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let ptr = unsafe { System.alloc_zeroed(layout) };
            note(ptr, 1);
            ptr
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(ptr, -1);
            let new = unsafe { System.realloc(ptr, layout, new_size) };
            note(if new.is_null() { ptr } else { new }, 1);
            new
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            note(ptr, -1);
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Counts from zero.
    pub fn start() {
        BYTES.with(|b| b.set(0));
        ON.with(|on| on.set(true));
    }

    /// The bytes held for blocks allocated since [`start`] and not freed.
    pub fn now() -> isize {
        BYTES.with(Cell::get)
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static HELD: held::Held = held::Held;

/// What the store counts covers what the allocator holds for it, and stays within the bound,
/// as records of two shapes come and go for long enough that its maps settle: the bench's jobs
/// (a 12-byte scope, a 20-byte key, a 58-byte result) and `memory_store_run`'s (a 7-digit key,
/// a 46-byte result), each at three bounds, and with a failed attempt (a released key, claimed
/// again) every tenth job.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test]
async fn the_bound_holds_against_the_allocator() {
    use std::fmt::Write;
    let result = |len| vec![b'r'; len];
    for (shape, key_digits, result) in [("bench", 16, result(58)), ("run", 7, result(46))] {
        for max_bytes in [256 << 10, 1 << 20, 3 << 20] {
            let store = MemoryStore::builder()
                .max_bytes(max_bytes)
                .min_retention(Duration::ZERO)
                .build();
            let mut worst = 0f64;
            let mut name = String::with_capacity(32);
            held::start();
            for id in 0..(80 * max_bytes / 1024) as u64 {
                name.clear();
                let _ = write!(name, "job-{id:0key_digits$}");
                let k = StoreKey {
                    scope: "bench.charge",
                    key: &name,
                };
                assert_eq!(
                    store.claim_plain(k, "t", None, LEASE).await,
                    Ok(Claim::Acquired)
                );
                if id % 10 == 0 {
                    store.release(k, "t").await.unwrap();
                    assert_eq!(
                        store.claim_plain(k, "u", None, LEASE).await,
                        Ok(Claim::Acquired)
                    );
                    store.complete(k, "u", &result, LEASE * 10).await.unwrap();
                } else {
                    store.complete(k, "t", &result, LEASE * 10).await.unwrap();
                }
                if id % 1_000 == 999 {
                    let stats = store.stats();
                    assert!(stats.bytes <= max_bytes, "{stats:?}");
                    worst = worst.max(held::now() as f64 / stats.bytes as f64);
                }
            }
            let stats = store.stats();
            println!(
                "{shape} records, bound {max_bytes}: {} records, {} bytes counted, {} held by \
                 the allocator; held / counted at worst {worst:.3}",
                stats.records,
                stats.bytes,
                held::now()
            );
            assert!(stats.evicted > 0, "{stats:?}");
            assert!(worst <= 1.0, "{shape}, {max_bytes}: {worst:.3}");
        }
    }
}
