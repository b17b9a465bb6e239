//! The stored form of a job's result, as every store keeps it, and the claim token: below the
//! stores and the idempotency layer, so that both can use them.

mod finite;

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
/// Its version is [`UNREPLAYABLE_VERSION`], which a build that predates it refuses as
/// [`Error::Corrupt`] (with version 1, such a build would read the missing `ok` of an
/// `Option` result as `None`, a replay of a value the job never returned).
#[derive(Serialize, Deserialize)]
struct Unreplayable<'a> {
    v: u32,
    unreplayable: std::borrow::Cow<'a, str>,
}

/// The format version of the record of a result that could not be kept (see [`Unreplayable`]).
const UNREPLAYABLE_VERSION: u32 = 2;

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
        v: UNREPLAYABLE_VERSION,
        unreplayable: why.into(),
    })
    .unwrap_or_else(|_| br#"{"v":2,"unreplayable":"the result could not be stored"}"#.to_vec())
}

/// The record of `value`, checked when it holds a JSON `null` (what JSON makes of a `NaN` or
/// infinite float, and of `None` and `()`): `Err` with the reason when the value does not
/// serialize, holds a float that is not finite (which would read back as `None` in an
/// `Option`, or not at all), or does not decode as its own type, so that it is never stored to
/// fail every replay or to replay a value the job never returned. A record without a `null` is
/// not checked further: the check costs a scan.
///
/// Not caught: a type whose `Deserialize` does not read what its `Serialize` writes, in a record
/// with no `null` (its replay fails with [`Error::Corrupt`]).
pub(crate) fn encode_replayable<T: Serialize + DeserializeOwned>(
    value: &T,
) -> Result<Vec<u8>, String> {
    let record = encode_record(value).map_err(|e| format!("it does not serialize: {e}"))?;
    // A value with no `null` anywhere in its JSON round-trips as it is; only one with a `null`
    // needs the check below.
    if !std::str::from_utf8(&record).map_or(true, |json| json.contains("null")) {
        return Ok(record);
    }
    finite::check(value).map_err(|why| why.to_string())?;
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
    match (version.v, version.unreplayable) {
        (RECORD_VERSION, None) => {}
        (UNREPLAYABLE_VERSION, Some(why)) => {
            return Err(Error::Unreplayable(format!(
                "the job completed, but its result could not be kept to replay ({why}); it is \
                 not run again"
            )));
        }
        (v, _) => {
            return Err(Error::Corrupt(format!(
                "idempotency record format version {v} (this build reads {RECORD_VERSION} and \
                 {UNREPLAYABLE_VERSION})"
            )));
        }
    }
    let record: RecordIn<T> = serde_json::from_slice(bytes).map_err(|e| {
        Error::Corrupt(format!(
            "idempotency record's result does not decode as this job's type: {e}"
        ))
    })?;
    debug_assert_eq!(record.v, RECORD_VERSION);
    Ok(record.ok)
}

/// `error`, after settling the runner's delivery in scope (see
/// [`Delivery::scope_settled`](crate::Delivery::scope_settled)) when it is a refusal no
/// redelivery can change while the key's record stands: a replay of a result that could not be
/// kept. How the guard and `PgStore`'s transactional form return it; a reused key is
/// [`key_reused`]'s.
pub(crate) fn settled(error: Error) -> Error {
    if matches!(error, Error::Unreplayable(_)) {
        crate::attempt::Delivery::settle();
    }
    error
}

/// [`Error::KeyReused`] for a key another fingerprint holds: against a `completed` record it
/// settles the runner's delivery in scope (no redelivery can change it while the record
/// stands); against a live claim it does not (that run may fail and release the key, and a
/// redelivery then runs the job).
pub(crate) fn key_reused(completed: bool) -> Error {
    if completed {
        crate::attempt::Delivery::settle();
    }
    Error::KeyReused
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
        assert_eq!(why, "it holds the float NaN, which JSON keeps as null");
        // A value whose own `Deserialize` refuses what its `Serialize` wrote, with a `null`.
        #[derive(serde::Serialize)]
        struct Out {
            a: Option<u8>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct In {}
        #[derive(Debug)]
        struct Asymmetric;
        impl serde::Serialize for Asymmetric {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                Out { a: None }.serialize(s)
            }
        }
        impl<'de> serde::Deserialize<'de> for Asymmetric {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                In::deserialize(d).map(|_| Asymmetric)
            }
        }
        let why = encode_replayable(&Asymmetric).unwrap_err();
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
        assert!(
            record.starts_with(br#"{"v":2,"#),
            "older builds refuse version 2"
        );
        let expected = Error::Unreplayable(
            "the job completed, but its result could not be kept to replay (it does not \
             serialize: \"quoted\"); it is not run again"
                .into(),
        );
        assert_eq!(decode::<u32>(&record), Err(expected.clone()));
        assert_eq!(decode::<Option<u32>>(&record), Err(expected.clone()));
        assert_eq!(decode::<String>(&record), Err(expected));
    }

    #[test]
    fn an_unknown_version_or_a_marker_under_version_one_is_corrupt() {
        for record in [
            &br#"{"v":3,"ok":1}"#[..],
            br#"{"v":1,"unreplayable":"x"}"#,
            br#"{"v":2,"ok":1}"#,
        ] {
            assert!(
                matches!(decode::<Option<u32>>(record), Err(Error::Corrupt(_))),
                "{}",
                String::from_utf8_lossy(record)
            );
        }
    }

    #[test]
    fn a_record_without_null_is_not_decoded_and_one_with_null_is() {
        assert!(encode_replayable(&Some(1.5f64)).is_ok());
        assert!(encode_replayable(&None::<f64>).is_ok());
        assert!(encode_replayable(&vec![1.0, f64::NAN]).is_err());
        // JSON cannot tell this `NaN` from `None`: it would read back as `None`.
        assert_eq!(
            encode_replayable(&Some(f64::NAN)),
            Err("it holds the float NaN, which JSON keeps as null".to_owned())
        );
    }
}
