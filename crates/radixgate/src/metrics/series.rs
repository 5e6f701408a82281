//! A per-family cache of metric handles, so recording an existing series
//! is a hash lookup under a read lock plus an atomic add, instead of
//! building, cloning and hashing a recorder `Key` on every call (measured in
//! `benches/metrics.rs`).
//!
//! Lookups borrow their key (`&str` for a model or worker), so a hit
//! allocates nothing; a miss takes the write lock once to register the
//! series. The lock is a `parking_lot::RwLock` because reads vastly
//! outnumber the few inserts (one per new label combination) and no caller
//! ever holds it across `.await` (it is only taken inside these methods).

use ::metrics::{Counter, Gauge, Histogram};
use hashbrown::{Equivalent, HashMap};
use parking_lot::RwLock;
use std::collections::HashSet;
use std::hash::Hash;

/// Handles of one metric family, by label values.
#[derive(Debug)]
pub(super) struct Series<K, V> {
    map: RwLock<HashMap<K, V>>,
}

impl<K: Hash + Eq, V> Series<K, V> {
    pub(super) fn new() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
        }
    }

    /// Runs `f` on the handle for `key`, registering it with `make` (and
    /// storing it under `owned()`) the first time.
    pub(super) fn with<Q, R>(
        &self,
        key: &Q,
        owned: impl FnOnce() -> K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V) -> R,
    ) -> R
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        if let Some(handle) = self.map.read().get(key) {
            return f(handle);
        }
        let mut map = self.map.write();
        let handle = match map.get(key) {
            Some(handle) => handle,
            None => map.entry(owned()).or_insert_with(make),
        };
        f(handle)
    }
}

/// A family's cache as the gateway's [`super::Metrics`] keeps it: to mark
/// its series used (the exporter forgets series nobody used for a while)
/// and to forget a removed worker's.
pub(super) trait Cache: Send + Sync {
    /// Forgets the handles of the series labelled with one of `retired`
    /// (removed workers' URLs), so that they are no longer touched;
    /// returns how many were forgotten.
    fn forget(&self, retired: &HashSet<Box<str>>) -> usize;
    /// Marks every cached series as used, without changing its value.
    fn touch(&self);
}

impl<K, V> Cache for Series<K, V>
where
    K: SeriesKey + Send + Sync,
    V: Touch + Send + Sync,
{
    fn forget(&self, retired: &HashSet<Box<str>>) -> usize {
        if retired.is_empty() {
            return 0;
        }
        let mut map = self.map.write();
        let before = map.len();
        map.retain(|key, _| !key.text().is_some_and(|t| retired.contains(t)));
        before - map.len()
    }

    fn touch(&self) {
        for handle in self.map.read().values() {
            handle.touch();
        }
    }
}

/// Label values of a cached series: the one that may be a worker's URL.
/// Static labels the code chooses never are.
pub trait SeriesKey {
    /// The label value a caller gave (a worker's URL, a model, a tenant).
    fn text(&self) -> Option<&str> {
        None
    }
}

impl SeriesKey for () {}

impl SeriesKey for &'static str {}

impl SeriesKey for Box<str> {
    fn text(&self) -> Option<&str> {
        Some(self)
    }
}

impl SeriesKey for String {
    fn text(&self) -> Option<&str> {
        Some(self)
    }
}

impl SeriesKey for LabelKey {
    fn text(&self) -> Option<&str> {
        Some(&self.text)
    }
}

/// A handle that can be marked used without changing its value.
pub trait Touch {
    /// Marks the series used.
    fn touch(&self);
}

impl Touch for Counter {
    fn touch(&self) {
        self.increment(0);
    }
}

impl Touch for Gauge {
    fn touch(&self) {
        self.increment(0.0);
    }
}

/// Histograms are never forgotten by the exporter (nor labelled by worker).
impl Touch for Histogram {
    fn touch(&self) {}
}

/// Owned label values of a series: a static label, a code, a caller's text.
#[derive(Debug, Hash, PartialEq, Eq)]
pub(crate) struct LabelKey {
    pub(crate) fixed: &'static str,
    pub(crate) code: u16,
    pub(crate) text: Box<str>,
}

/// The borrowed form of [`LabelKey`]; hashes identically (same field
/// order; `Box<str>` hashes as its `str`).
#[derive(Debug, Hash)]
pub(crate) struct LabelRef<'a> {
    pub(crate) fixed: &'static str,
    pub(crate) code: u16,
    pub(crate) text: &'a str,
}

impl LabelRef<'_> {
    pub(crate) fn to_owned_key(&self) -> LabelKey {
        LabelKey {
            fixed: self.fixed,
            code: self.code,
            text: self.text.into(),
        }
    }
}

impl Equivalent<LabelKey> for LabelRef<'_> {
    fn equivalent(&self, key: &LabelKey) -> bool {
        self.fixed == key.fixed && self.code == key.code && self.text == &*key.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn registers_once_per_key_and_borrows_on_lookup() {
        let series: Series<LabelKey, u32> = Series::new();
        let made = Cell::new(0);
        let get = |fixed, code, text| {
            let key = LabelRef { fixed, code, text };
            series.with(
                &key,
                || key.to_owned_key(),
                || {
                    made.set(made.get() + 1);
                    made.get()
                },
                |v| *v,
            )
        };
        assert_eq!(get("/a", 200, "m1"), 1);
        assert_eq!(get("/a", 200, "m1"), 1);
        assert_eq!(get("/a", 404, "m1"), 2);
        assert_eq!(get("/b", 200, "m1"), 3);
        assert_eq!(get("/a", 200, "m2"), 4);
        assert_eq!(get("/a", 200, "m1"), 1);
        assert_eq!(made.get(), 4);
    }
}
