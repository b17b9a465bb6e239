//! Whether a value holds a float JSON cannot keep: `NaN` and the infinities, which `serde_json`
//! writes as `null`. Where `null` is a valid value (`Option<f64>`), such a float would read back
//! as `None`, a value the job never returned, so [`encode_replayable`](super::encode_replayable)
//! refuses it. A walk over the value with a serializer that writes nothing.

use serde::ser::{self, Serialize};
use std::fmt::{self, Display};

/// Walks `value`: `Err` at the first float that is not finite.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), NotFinite> {
    value.serialize(Probe)
}

/// A float that is not finite, or an error of the value's own `Serialize`.
#[derive(Debug)]
pub(crate) struct NotFinite(String);

impl Display for NotFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFinite {}

impl ser::Error for NotFinite {
    fn custom<M: Display>(msg: M) -> Self {
        NotFinite(msg.to_string())
    }
}

/// The serializer that writes nothing and fails on a float that is not finite.
struct Probe;

fn float(value: f64) -> Result<(), NotFinite> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(NotFinite(format!(
            "it holds the float {value}, which JSON keeps as null"
        )))
    }
}

/// The methods that accept a leaf value without looking at it.
macro_rules! leaves {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method(self, _: $ty) -> Result<(), NotFinite> {
            Ok(())
        }
    )*};
}

impl ser::Serializer for Probe {
    type Ok = ();
    type Error = NotFinite;
    type SerializeSeq = Probe;
    type SerializeTuple = Probe;
    type SerializeTupleStruct = Probe;
    type SerializeTupleVariant = Probe;
    type SerializeMap = Probe;
    type SerializeStruct = Probe;
    type SerializeStructVariant = Probe;

    leaves!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_f32(self, value: f32) -> Result<(), NotFinite> {
        float(f64::from(value))
    }

    fn serialize_f64(self, value: f64) -> Result<(), NotFinite> {
        float(value)
    }

    fn serialize_none(self) -> Result<(), NotFinite> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotFinite> {
        value.serialize(Probe)
    }

    fn serialize_unit(self) -> Result<(), NotFinite> {
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), NotFinite> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        value.serialize(Probe)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        value.serialize(Probe)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_tuple(self, _: usize) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Probe, NotFinite> {
        Ok(Probe)
    }
}

/// The compound forms: each element, key and field is walked as a value of its own.
macro_rules! compound {
    ($($trait:ident :: $method:ident ($($name:ident),*)),* $(,)?) => {$(
        impl ser::$trait for Probe {
            type Ok = ();
            type Error = NotFinite;

            fn $method<T: Serialize + ?Sized>(
                &mut self,
                $($name: &'static str,)*
                value: &T,
            ) -> Result<(), NotFinite> {
                $(let _ = $name;)*
                value.serialize(Probe)
            }

            fn end(self) -> Result<(), NotFinite> {
                Ok(())
            }
        }
    )*};
}

compound!(
    SerializeSeq::serialize_element(),
    SerializeTuple::serialize_element(),
    SerializeTupleStruct::serialize_field(),
    SerializeTupleVariant::serialize_field(),
    SerializeStruct::serialize_field(key),
    SerializeStructVariant::serialize_field(key),
);

impl ser::SerializeMap for Probe {
    type Ok = ();
    type Error = NotFinite;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotFinite> {
        key.serialize(Probe)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
        value.serialize(Probe)
    }

    fn end(self) -> Result<(), NotFinite> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use std::collections::BTreeMap;

    #[derive(serde::Serialize)]
    enum Shape {
        Unit,
        Point(f64, f64),
        Named { ratio: Option<f32> },
    }

    #[test]
    fn a_float_that_is_not_finite_is_found_wherever_it_is() {
        assert!(check(&1.5f64).is_ok());
        assert!(check(&Some(f64::NAN)).is_err());
        assert!(check(&vec![Some(1.0), None, Some(f64::INFINITY)]).is_err());
        assert!(check(&BTreeMap::from([("a", f32::NEG_INFINITY)])).is_err());
        assert!(check(&(1u8, "x", [0.5f64; 3])).is_ok());
        assert!(check(&Shape::Unit).is_ok());
        assert!(check(&Shape::Point(0.0, f64::NAN)).is_err());
        assert!(
            check(&Shape::Named {
                ratio: Some(f32::NAN)
            })
            .is_err()
        );
        assert!(check(&Shape::Named { ratio: None }).is_ok());
        let why = check(&Some(f64::NAN)).unwrap_err().to_string();
        assert_eq!(why, "it holds the float NaN, which JSON keeps as null");
    }
}
