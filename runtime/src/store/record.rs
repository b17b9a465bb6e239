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

/// The record of a job that completed with a result that could not be kept to replay: the
/// key stays completed, and a replay is [`Error::Unreplayable`] with `unreplayable`'s reason.
/// A build that predates it reads no `ok` in it and fails closed with [`Error::Corrupt`].
#[derive(Serialize, Deserialize)]
struct Unreplayable<'a> {
    v: u32,
    unreplayable: std::borrow::Cow<'a, str>,
}

/// The stored form of a job's `Ok` value, as every store keeps it.
pub(crate) fn encode_record<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&RecordOut {
        v: RECORD_VERSION,
        ok: value,
    })
}

/// The record of a job whose result `why` could not be kept: see [`Error::Unreplayable`].
pub(crate) fn encode_unreplayable(why: &str) -> Vec<u8> {
    serde_json::to_vec(&Unreplayable {
        v: RECORD_VERSION,
        unreplayable: why.into(),
    })
    .unwrap_or_else(|_| br#"{"v":1,"unreplayable":"the result could not be stored"}"#.to_vec())
}

/// The record of `value`, checked to read back as a `T`: `Err` with the reason when the value
/// does not serialize, or serializes to something that does not decode as its own type (JSON
/// keeps a `NaN` float as `null`), so that it is never stored to fail every replay.
pub(crate) fn encode_replayable<T: Serialize + DeserializeOwned>(
    value: &T,
) -> Result<Vec<u8>, String> {
    let record = encode_record(value).map_err(|e| format!("it does not serialize: {e}"))?;
    match serde_json::from_slice::<RecordIn<T>>(&record) {
        Ok(_) => Ok(record),
        Err(e) => Err(format!("it does not read back as its own type: {e}")),
    }
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    #[derive(Deserialize)]
    struct Version<'a> {
        v: u32,
        #[serde(default, borrow)]
        unreplayable: Option<std::borrow::Cow<'a, str>>,
    }
    let version: Version<'_> = serde_json::from_slice(bytes)
        .map_err(|e| Error::Corrupt(format!("idempotency record is not JSON: {e}")))?;
    if version.v != RECORD_VERSION {
        return Err(Error::Corrupt(format!(
            "idempotency record format version {} (this build reads {RECORD_VERSION})",
            version.v
        )));
    }
    if let Some(why) = version.unreplayable {
        return Err(Error::Unreplayable(why.into_owned()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_stored_as_v1_json_and_read_back() {
        let record = encode_replayable(&(1u32, "a".to_owned())).unwrap();
        assert_eq!(record, br#"{"v":1,"ok":[1,"a"]}"#);
        assert_eq!(decode::<(u32, String)>(&record), Ok((1, "a".to_owned())));
    }

    #[test]
    fn a_value_that_cannot_be_replayed_is_refused_with_its_reason() {
        let map = std::collections::HashMap::from([((1u8, 2u8), 3u8)]);
        let why = encode_replayable(&map).unwrap_err();
        assert!(why.starts_with("it does not serialize: "), "{why}");
        let why = encode_replayable(&f64::NAN).unwrap_err();
        assert!(
            why.starts_with("it does not read back as its own type: "),
            "{why}"
        );
        assert!(
            encode_replayable(&f64::INFINITY).is_err(),
            "JSON has no infinity either"
        );
        assert!(encode_replayable(&1.5f64).is_ok());
    }

    #[test]
    fn the_record_of_an_unreplayable_result_replays_as_its_error_for_any_type() {
        let record = encode_unreplayable("it does not serialize: \"quoted\"");
        let expected = Error::Unreplayable("it does not serialize: \"quoted\"".into());
        assert_eq!(decode::<u32>(&record), Err(expected.clone()));
        assert_eq!(decode::<String>(&record), Err(expected));
    }
}
