//! The stored form of a job's result, as every store keeps it, and the claim token: below the
//! stores and the idempotency layer, so that both can use them.

use crate::Error;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The format version of stored records: the JSON a job's result is kept as (`{"v":1,"ok":...}`),
/// the same in every store. The stores' own layouts around it carry their own versions (Redis:
/// `jg1/` for completed records, `jg2/` for counted claims; Postgres: its columns), which crash
/// counting changed without changing this one.
pub const RECORD_VERSION: u32 = 1;

/// Default time a completed result is kept: 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default claim lease: 30 seconds, renewed while the work runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

#[derive(Serialize)]
struct RecordOut<'a, T> {
    v: u32,
    ok: &'a T,
}

#[derive(Deserialize)]
struct RecordIn<T> {
    v: u32,
    ok: T,
}

/// The stored form of a job's `Ok` value, as every store keeps it.
pub(crate) fn encode_record<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&RecordOut {
        v: RECORD_VERSION,
        ok: value,
    })
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version = serde_json::from_slice(bytes)
        .map_err(|e| Error::Corrupt(format!("idempotency record is not JSON: {e}")))?;
    if version.v != RECORD_VERSION {
        return Err(Error::Corrupt(format!(
            "idempotency record format version {} (this build reads {RECORD_VERSION})",
            version.v
        )));
    }
    let record: RecordIn<T> = serde_json::from_slice(bytes).map_err(|e| {
        Error::Corrupt(format!(
            "idempotency record's result does not decode as this job's type: {e}"
        ))
    })?;
    debug_assert_eq!(record.v, RECORD_VERSION);
    Ok(record.ok)
}

/// A fresh claim token: 128 random bits.
pub(crate) fn new_token() -> String {
    use rand::Rng;
    format!("{:032x}", rand::rng().random::<u128>())
}
