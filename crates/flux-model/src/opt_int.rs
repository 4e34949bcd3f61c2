//! An optional integer in 8 bytes, where `Option<i64>` takes 16: a job
//! keeps four (user id, urgency, priority, wait status), a million active
//! jobs four million. `i64::MIN` stands for "none": no Flux value is it
//! (user ids are 32-bit, urgencies 0–31, priorities 0–2³²−1, wait
//! statuses C ints), and one read as it is taken as absent.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An integer that may be absent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OptInt(i64);

impl OptInt {
    pub const NONE: OptInt = OptInt(i64::MIN);

    pub fn get(self) -> Option<i64> {
        (self.0 != i64::MIN).then_some(self.0)
    }

    pub fn is_some(self) -> bool {
        self.0 != i64::MIN
    }

    pub fn set(&mut self, n: i64) {
        self.0 = n;
    }

    pub fn clear(&mut self) {
        self.0 = i64::MIN;
    }
}

impl Default for OptInt {
    fn default() -> Self {
        OptInt::NONE
    }
}

impl From<Option<i64>> for OptInt {
    fn from(n: Option<i64>) -> Self {
        OptInt(n.unwrap_or(i64::MIN))
    }
}

impl std::fmt::Debug for OptInt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// Saved as an `Option<i64>`: the same bytes as before it was packed.
impl Serialize for OptInt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OptInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<i64>::deserialize(d).map(OptInt::from)
    }
}

#[cfg(test)]
mod tests {
    use super::OptInt;
    use proptest::prelude::*;

    #[test]
    fn none_is_none_and_it_fits_in_eight_bytes() {
        assert_eq!(OptInt::NONE.get(), None);
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
        fn saves_as_an_option_of_i64(n in proptest::option::of(any::<i64>().prop_filter("not the none", |n| *n != i64::MIN))) {
            let packed = rmp_serde::to_vec(&OptInt::from(n)).expect("encode");
            prop_assert_eq!(&packed, &rmp_serde::to_vec(&n).expect("encode"));
            let back: OptInt = rmp_serde::from_slice(&packed).expect("decode");
            prop_assert_eq!(back.get(), n);
        }
    }
}
