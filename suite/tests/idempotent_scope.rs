//! The default scope of `#[idempotent]` (module path and function name) is one function's
//! alone: two functions that would share it fail with `Error::Config` instead of replaying each
//! other's results.

use jobguard::idempotent;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

fn config_error(e: &io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<jobguard::Error>())
    {
        Some(jobguard::Error::Config(msg)) => msg.clone(),
        other => panic!("expected Error::Config, got {other:?} ({e})"),
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

async fn first(id: &str) -> Result<u32, io::Error> {
    #[idempotent(key = id)]
    async fn job(id: &str) -> Result<u32, io::Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(111)
    }
    job(id).await
}

async fn second(id: &str) -> Result<u32, io::Error> {
    #[idempotent(key = id)]
    async fn job(id: &str) -> Result<u32, io::Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(222)
    }
    job(id).await
}

#[tokio::test]
async fn two_functions_with_one_default_scope_fail_instead_of_sharing_keys() {
    // The first function alone works, and replays.
    assert_eq!(first("same-key").await.unwrap(), 111);
    assert_eq!(first("same-key").await.unwrap(), 111);
    // The second would read the first's record for the same key: it is refused, and runs nothing.
    let refused = second("same-key").await.unwrap_err();
    let msg = config_error(&refused);
    assert!(
        msg.contains("idempotent_scope::job") && msg.contains("scope = "),
        "{msg}"
    );
    // From now on both are refused, whichever runs: the name is known to be shared.
    config_error(&first("same-key").await.unwrap_err());
    config_error(&first("another-key").await.unwrap_err());
    config_error(&second("another-key").await.unwrap_err());
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        1,
        "only the first call ran a body"
    );
}

/// Pinned scopes are never compared: two functions may share one on purpose.
mod pinned {
    use super::*;

    pub async fn third(id: &str) -> Result<u32, io::Error> {
        #[idempotent(key = id, scope = "pinned.job")]
        async fn job(id: &str) -> Result<u32, io::Error> {
            Ok(3)
        }
        job(id).await
    }

    pub async fn fourth(id: &str) -> Result<u32, io::Error> {
        #[idempotent(key = id, scope = "pinned.job")]
        async fn job(id: &str) -> Result<u32, io::Error> {
            Ok(4)
        }
        job(id).await
    }
}

#[tokio::test]
async fn a_pinned_scope_is_shared_on_purpose() {
    assert_eq!(pinned::third("k").await.unwrap(), 3);
    assert_eq!(
        pinned::fourth("k").await.unwrap(),
        3,
        "the shared record replays"
    );
}

/// A generic function is one function: its instances share its scope without a conflict.
#[idempotent(key = id)]
async fn generic<T: Default + serde::Serialize + serde::de::DeserializeOwned>(
    id: &str,
) -> Result<T, io::Error> {
    Ok(T::default())
}

#[tokio::test]
async fn the_instances_of_a_generic_function_are_one_function() {
    assert_eq!(generic::<u32>("g-1").await.unwrap(), 0);
    assert_eq!(generic::<u64>("g-2").await.unwrap(), 0);
    assert_eq!(generic::<u32>("g-1").await.unwrap(), 0);
}
