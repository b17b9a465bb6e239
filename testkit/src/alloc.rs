//! A global allocator that counts the allocations made on the current thread while counting is
//! switched on, so that a test can show a path allocates nothing. Other threads (the test
//! harness, runtime workers) are not counted.
//!
//! ```
//! use jobguard_testkit::alloc::{self, Counting};
//!
//! #[global_allocator]
//! static GLOBAL: Counting = Counting;
//!
//! fn main() {
//!     let (n, boxed) = alloc::during(|| Box::new(7u64));
//!     assert_eq!((n, *boxed), (1, 7));
//!     assert_eq!(alloc::during(|| 7u64 + 1).0, 0);
//! }
//! ```
//!
//! Around an `.await`, where a closure cannot reach, switch it on and off by hand:
//! [`start`] before the call, [`stop`] after it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator: the system allocator, plus a count. Install it in the test binary
/// with `#[global_allocator]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread-locals are being torn down.
    let _ = ON.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Switches counting on for the current thread, from zero.
pub fn start() {
    COUNT.with(|n| n.set(0));
    ON.with(|on| on.set(true));
}

/// Switches counting off for the current thread and returns the allocations since [`start`].
pub fn stop() -> usize {
    ON.with(|on| on.set(false));
    COUNT.with(Cell::get)
}

/// Runs `f` with counting on; returns the allocations it made on this thread, and its result.
pub fn during<R>(f: impl FnOnce() -> R) -> (usize, R) {
    start();
    let out = f();
    (stop(), out)
}
