//! An optional event timestamp in 8 bytes, where `Option<f64>` takes 16: a
//! job keeps ten of them, a million active jobs ten million. NaN stands
//! for "none": no event has a NaN timestamp (decoding refuses them).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A timestamp that may be absent (seconds since the epoch).
#[derive(Clone, Copy)]
pub struct Stamp(f64);

impl Stamp {
    pub const NONE: Stamp = Stamp(f64::NAN);

    pub fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }

    pub fn is_some(self) -> bool {
        !self.0.is_nan()
    }

    pub fn set(&mut self, t: f64) {
        self.0 = t;
    }

    pub fn clear(&mut self) {
        self.0 = f64::NAN;
    }
}

impl Default for Stamp {
    fn default() -> Self {
        Stamp::NONE
    }
}

impl From<Option<f64>> for Stamp {
    fn from(t: Option<f64>) -> Self {
        Stamp(t.unwrap_or(f64::NAN))
    }
}

/// Two absent stamps are equal (NaN is not equal to itself).
impl PartialEq for Stamp {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// Saved as an `Option<f64>`: the same bytes as before stamps were packed.
impl Serialize for Stamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<f64>::deserialize(d).map(Stamp::from)
    }
}

#[cfg(test)]
mod tests {
    use super::Stamp;
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
    }

    proptest! {
        #[test]
        fn saves_as_an_option_of_f64(t in proptest::option::of(any::<f64>().prop_filter("not NaN", |t| !t.is_nan()))) {
            let packed = rmp_serde::to_vec(&Stamp::from(t)).expect("encode");
            prop_assert_eq!(&packed, &rmp_serde::to_vec(&t).expect("encode"));
            let back: Stamp = rmp_serde::from_slice(&packed).expect("decode");
            prop_assert_eq!(back.get(), t);
        }
    }
}
