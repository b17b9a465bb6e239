//! `#[idempotent]` with a result that cannot be kept to replay: the call that ran returns it,
//! and a redelivery fails with `Error::Unreplayable` instead of running the job again.

use jobguard::idempotent;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

/// The `jobguard::Error` inside a job's `io::Error`.
fn jobguard_error(e: &io::Error) -> &jobguard::Error {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<jobguard::Error>())
        .unwrap_or_else(|| panic!("not a jobguard error: {e:?}"))
}

static PAIRS_RUNS: AtomicU32 = AtomicU32::new(0);

/// A map with tuple keys: `Serialize`, but JSON refuses non-string keys.
#[idempotent(key = id)]
async fn pairs(id: &str) -> Result<HashMap<(u32, u32), u32>, io::Error> {
    PAIRS_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(HashMap::from([((1, 2), 3)]))
}

#[tokio::test]
async fn a_result_that_does_not_serialize_is_returned_and_never_run_again() {
    let first = pairs("pairs-1").await.unwrap();
    assert_eq!(
        first,
        HashMap::from([((1, 2), 3)]),
        "the call that ran returns its value"
    );
    for _ in 0..2 {
        let again = pairs("pairs-1").await.unwrap_err();
        match jobguard_error(&again) {
            jobguard::Error::Unreplayable(why) => {
                assert!(why.contains("does not serialize"), "{why}")
            }
            other => panic!("expected Unreplayable, got {other:?}"),
        }
        assert!(again.to_string().contains("it is not run again"), "{again}");
    }
    // Under a job runner the replay settles the delivery: the job ran, so it is not delivered
    // again (as a poisoned key's refusal is).
    let (again, settled) = jobguard::Delivery {
        number: 1,
        last: false,
    }
    .scope_settled(pairs("pairs-1"))
    .await;
    assert!(matches!(
        jobguard_error(&again.unwrap_err()),
        jobguard::Error::Unreplayable(_)
    ));
    assert!(settled, "an unreplayable replay settles the delivery");
    assert_eq!(PAIRS_RUNS.load(Ordering::SeqCst), 1, "the body ran once");
}

static RATIO_RUNS: AtomicU32 = AtomicU32::new(0);

/// A float: `NaN` serializes as JSON `null`, which does not read back as an `f64`.
#[idempotent(key = id)]
async fn ratio(id: &str, value: f64) -> Result<f64, io::Error> {
    RATIO_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

/// The same in an `Option`, where `null` would read back as `None`: a value never returned.
#[idempotent(key = id)]
async fn maybe_ratio(id: &str, value: Option<f64>) -> Result<Option<f64>, io::Error> {
    RATIO_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

/// The reason an `Unreplayable` error gives.
fn unreplayable(e: &io::Error) -> &str {
    match jobguard_error(e) {
        jobguard::Error::Unreplayable(why) => why,
        other => panic!("expected Unreplayable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_float_json_cannot_keep_is_never_stored_to_fail_or_to_replay_as_none() {
    assert!(ratio("ratio-nan", f64::NAN).await.unwrap().is_nan());
    let again = ratio("ratio-nan", f64::NAN).await.unwrap_err();
    assert!(unreplayable(&again).contains("the float NaN"), "{again}");
    let first = maybe_ratio("maybe-inf", Some(f64::INFINITY)).await.unwrap();
    assert_eq!(first, Some(f64::INFINITY));
    let again = maybe_ratio("maybe-inf", Some(f64::INFINITY))
        .await
        .unwrap_err();
    assert!(unreplayable(&again).contains("the float inf"), "{again}");
    // Ordinary values of the same jobs, `None` included, are stored and replayed.
    assert_eq!(ratio("ratio-1.5", 1.5).await.unwrap(), 1.5);
    assert_eq!(ratio("ratio-1.5", 1.5).await.unwrap(), 1.5);
    assert_eq!(maybe_ratio("maybe-none", None).await.unwrap(), None);
    assert_eq!(maybe_ratio("maybe-none", Some(2.0)).await.unwrap(), None);
    assert_eq!(RATIO_RUNS.load(Ordering::SeqCst), 4, "one run per key");
}
