//! Optional values in the room of the value: `Option<f64>` and
//! `Option<i64>` take 16 bytes, these 8. A job keeps ten optional times
//! and four optional integers; a million active jobs, fourteen million.
//! "None" is a value no Flux field takes:
//! - a time ([`Stamp`]): NaN; no event has a NaN timestamp (decoding
//!   refuses them, and JSON has none);
//! - an integer ([`OptInt`]): `i64::MIN`; user ids are 32-bit, urgencies
//!   0–31, priorities 0–2³²−1, wait statuses C ints; one sent anyway reads
//!   as absent.
//!
//! Each is saved as the `Option` it stands for: checkpoints written before
//! it was packed read the same, and write the same bytes.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value one of whose values stands for "none".
pub trait Sentinel: Copy {
    const NONE: Self;
    fn is_none(self) -> bool;
}

impl Sentinel for f64 {
    const NONE: f64 = f64::NAN;
    fn is_none(self) -> bool {
        self.is_nan()
    }
}

impl Sentinel for i64 {
    const NONE: i64 = i64::MIN;
    fn is_none(self) -> bool {
        self == i64::MIN
    }
}

/// An optional value in the room of the value.
#[derive(Clone, Copy)]
pub struct Packed<T>(T);

/// A timestamp that may be absent (seconds since the epoch).
pub type Stamp = Packed<f64>;

/// An integer that may be absent.
pub type OptInt = Packed<i64>;

impl<T: Sentinel> Packed<T> {
    pub const NONE: Self = Packed(T::NONE);

    pub fn get(self) -> Option<T> {
        (!self.0.is_none()).then_some(self.0)
    }

    pub fn is_some(self) -> bool {
        !self.0.is_none()
    }

    pub fn set(&mut self, value: T) {
        self.0 = value;
    }

    pub fn clear(&mut self) {
        self.0 = T::NONE;
    }
}

impl<T: Sentinel> Default for Packed<T> {
    fn default() -> Self {
        Self::NONE
    }
}

impl<T: Sentinel> From<Option<T>> for Packed<T> {
    fn from(value: Option<T>) -> Self {
        Packed(value.unwrap_or(T::NONE))
    }
}

/// Two absent values are equal (NaN is not equal to itself).
impl<T: Sentinel + PartialEq> PartialEq for Packed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl<T: Sentinel + std::fmt::Debug> std::fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl<T: Sentinel + Serialize> Serialize for Packed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de, T: Sentinel + Deserialize<'de>> Deserialize<'de> for Packed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<T>::deserialize(d).map(Packed::from)
    }
}

#[cfg(test)]
mod tests {
    use super::{OptInt, Stamp};
    use proptest::prelude::*;

    #[test]
    fn none_is_none_and_equal_to_itself() {
        assert_eq!(Stamp::NONE.get(), None);
        assert_eq!(Stamp::default(), Stamp::NONE);
        let mut s = Stamp::NONE;
        s.set(1.5);
        assert_eq!(s.get(), Some(1.5));
        s.clear();
        assert!(!s.is_some());
        assert_eq!(std::mem::size_of::<Stamp>(), 8);

        assert_eq!(OptInt::default(), OptInt::NONE);
        let mut n = OptInt::NONE;
        n.set(-1);
        assert_eq!(n.get(), Some(-1));
        n.clear();
        assert!(!n.is_some());
        assert_eq!(std::mem::size_of::<OptInt>(), 8);
    }

    proptest! {
        #[test]
        fn a_stamp_saves_as_an_option_of_f64(t in proptest::option::of(any::<f64>().prop_filter("not NaN", |t| !t.is_nan()))) {
            let packed = rmp_serde::to_vec(&Stamp::from(t)).expect("encode");
            prop_assert_eq!(&packed, &rmp_serde::to_vec(&t).expect("encode"));
            let back: Stamp = rmp_serde::from_slice(&packed).expect("decode");
            prop_assert_eq!(back.get(), t);
        }

        #[test]
        fn an_int_saves_as_an_option_of_i64(n in proptest::option::of(any::<i64>().prop_filter("not the none", |n| *n != i64::MIN))) {
            let packed = rmp_serde::to_vec(&OptInt::from(n)).expect("encode");
            prop_assert_eq!(&packed, &rmp_serde::to_vec(&n).expect("encode"));
            let back: OptInt = rmp_serde::from_slice(&packed).expect("decode");
            prop_assert_eq!(back.get(), n);
        }
    }
}
