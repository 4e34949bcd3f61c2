//! A list for what is nearly always one thing or none: a subject's alert
//! conditions. One is held inline and more behind one pointer, in the
//! room of the one: the enum's tag lives in the item's spare values, so a
//! job's entry pays nothing beyond its one condition (a `SmallVec` adds a
//! length, which took each entry of a million over an allocation class).

use std::ops::{Deref, DerefMut};
use thin_vec::ThinVec;

#[derive(Debug, Clone, Default)]
pub enum Few<T> {
    #[default]
    Empty,
    One(T),
    /// Two or more (one or none only until [`Few::shrink_to_fit`]).
    Many(ThinVec<T>),
}

impl<T> Few<T> {
    pub fn new() -> Self {
        Few::Empty
    }

    pub fn push(&mut self, item: T) {
        *self = match std::mem::take(self) {
            Few::Empty => Few::One(item),
            Few::One(first) => {
                let mut many = ThinVec::with_capacity(2);
                many.push(first);
                many.push(item);
                Few::Many(many)
            }
            Few::Many(mut many) => {
                many.push(item);
                Few::Many(many)
            }
        };
    }

    /// Remove the item at `index`, the last taking its place.
    ///
    /// # Panics
    /// If `index` is out of bounds, as a slice's would.
    pub fn swap_remove(&mut self, index: usize) -> T {
        match self {
            Few::Many(many) => many.swap_remove(index),
            Few::One(_) if index == 0 => match std::mem::take(self) {
                Few::One(item) => item,
                _ => unreachable!("matched as one"),
            },
            _ => panic!("swap_remove index {index} out of bounds"),
        }
    }

    /// Whether its items are on the heap.
    pub fn spilled(&self) -> bool {
        matches!(self, Few::Many(_))
    }

    /// Room for items before it must grow: one inline, or the heap's.
    pub fn capacity(&self) -> usize {
        match self {
            Few::Many(many) => many.capacity(),
            _ => 1,
        }
    }

    /// Back inline when one or none is left; else exactly the room needed.
    pub fn shrink_to_fit(&mut self) {
        if let Few::Many(many) = self {
            match many.len() {
                0 => *self = Few::Empty,
                1 => {
                    if let Some(item) = many.pop() {
                        *self = Few::One(item);
                    }
                }
                _ => many.shrink_to_fit(),
            }
        }
    }
}

impl<T> Deref for Few<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Few::Empty => &[],
            Few::One(item) => std::slice::from_ref(item),
            Few::Many(many) => many,
        }
    }
}

impl<T> DerefMut for Few<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Few::Empty => &mut [],
            Few::One(item) => std::slice::from_mut(item),
            Few::Many(many) => many,
        }
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;

    fn into_iter(self) -> IntoIter<T> {
        match self {
            Few::Empty => IntoIter::One(None),
            Few::One(item) => IntoIter::One(Some(item)),
            Few::Many(many) => IntoIter::Many(many.into_iter()),
        }
    }
}

/// A [`Few`]'s items, by value.
pub enum IntoIter<T> {
    One(Option<T>),
    Many(thin_vec::IntoIter<T>),
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            IntoIter::One(item) => item.take(),
            IntoIter::Many(many) => many.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Few;
    use proptest::prelude::*;

    /// The room of its item, no more, when the item has spare values.
    #[test]
    fn it_takes_the_room_of_one_item() {
        #[allow(dead_code)]
        struct Item(u64, u64, bool);
        assert_eq!(
            std::mem::size_of::<Few<Item>>(),
            std::mem::size_of::<Item>()
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u8),
        SwapRemove(usize),
        Shrink,
    }

    proptest! {
        /// Whatever is done to it, it holds what a `Vec` would.
        #[test]
        fn it_holds_what_a_vec_holds(ops in proptest::collection::vec(
            prop_oneof![
                any::<u8>().prop_map(Op::Push),
                (0usize..4).prop_map(Op::SwapRemove),
                Just(Op::Shrink),
            ],
            0..40,
        )) {
            let (mut few, mut vec) = (Few::new(), Vec::new());
            for op in ops {
                match op {
                    Op::Push(x) => {
                        few.push(x);
                        vec.push(x);
                    }
                    Op::SwapRemove(i) if i < vec.len() => {
                        prop_assert_eq!(few.swap_remove(i), vec.swap_remove(i));
                    }
                    Op::SwapRemove(_) => {}
                    Op::Shrink => {
                        few.shrink_to_fit();
                        prop_assert_eq!(few.spilled(), vec.len() > 1);
                    }
                }
                prop_assert_eq!(&few[..], &vec[..]);
            }
            if let Some(first) = few.first_mut() {
                *first = first.wrapping_add(1);
            }
            if let Some(first) = vec.first_mut() {
                *first = first.wrapping_add(1);
            }
            prop_assert_eq!(few.into_iter().collect::<Vec<_>>(), vec);
        }
    }
}
