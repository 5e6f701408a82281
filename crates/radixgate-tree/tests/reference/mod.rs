//! A naive reference model of the tree, for property tests.
//!
//! Each tenant holds a map from every prefix (as chars) it holds to the
//! logical time of the newest insert through it. Eviction removes, one
//! character at a time, the prefix with no held extension (a leaf) and the
//! oldest time; times are unique per insert, so this order is total. It is
//! quadratic in text length and only fit for short texts.

use std::collections::BTreeMap;

use radixgate_tree::{PrefixMatch, TenantDepth, TenantHit, TenantId, TenantMatch, TenantMatches};

/// The model.
#[derive(Debug, Default)]
pub(crate) struct Model {
    max_total: usize,
    clock: u64,
    held: BTreeMap<TenantId, BTreeMap<Vec<char>, u64>>,
}

impl Model {
    /// Same meaning as `TreeConfig::max_total_chars`.
    pub(crate) fn new(max_total: usize) -> Self {
        Self {
            max_total,
            ..Self::default()
        }
    }

    /// Returns the insert's time and the chars of `text` the tenant held
    /// before it.
    pub(crate) fn insert(&mut self, text: &str, tenant: TenantId) -> (u64, usize) {
        self.clock += 1;
        let chars: Vec<char> = text.chars().collect();
        if chars.is_empty() {
            return (self.clock, 0);
        }
        let map = self.held.entry(tenant).or_default();
        let held = (1..=chars.len())
            .take_while(|&k| map.contains_key(&chars[..k]))
            .count();
        for k in 1..=chars.len() {
            map.insert(chars[..k].to_vec(), self.clock);
        }
        if self.total() > self.max_total {
            let target = self.max_total - self.max_total / 16;
            while self.total() > target {
                let Some((_, t, leaf)) = self
                    .held
                    .iter()
                    .filter_map(|(t, m)| oldest_leaf(m).map(|(time, leaf)| (time, *t, leaf)))
                    .min()
                else {
                    break;
                };
                self.remove_prefix(t, &leaf);
            }
        }
        (self.clock, held)
    }

    /// Takes back the insert of `text` at `time` that found `held` chars
    /// held: removes, from the longest prefix down, each prefix longer than
    /// `held` that still has that time and no held extension (skipping
    /// those already evicted).
    pub(crate) fn undo(&mut self, text: &str, tenant: TenantId, time: u64, held: usize) -> usize {
        let chars: Vec<char> = text.chars().collect();
        let mut removed = 0;
        for k in (held + 1..=chars.len()).rev() {
            let Some(m) = self.held.get(&tenant) else {
                break;
            };
            let prefix = &chars[..k];
            if !m.contains_key(prefix) {
                // Evicted since the insert.
                continue;
            }
            let leaf = !m.keys().any(|p| p.len() == k + 1 && p.starts_with(prefix));
            if m.get(prefix) != Some(&time) || !leaf {
                break;
            }
            self.remove_prefix(tenant, prefix);
            removed += 1;
        }
        removed
    }

    /// Removes every prefix the tenant holds that extends the first
    /// `keep + 1` chars of `text` (nothing when `text` is not longer) and
    /// has a time before `older_than`.
    pub(crate) fn trim(
        &mut self,
        text: &str,
        tenant: TenantId,
        keep: usize,
        older_than: u64,
    ) -> usize {
        let chars: Vec<char> = text.chars().collect();
        if chars.len() <= keep {
            return 0;
        }
        let cut = &chars[..=keep];
        let Some(m) = self.held.get_mut(&tenant) else {
            return 0;
        };
        let before = m.len();
        m.retain(|p, &mut t| !(p.starts_with(cut) && t < older_than));
        let removed = before - m.len();
        if m.is_empty() {
            self.held.remove(&tenant);
        }
        removed
    }

    fn remove_prefix(&mut self, tenant: TenantId, prefix: &[char]) {
        if let Some(m) = self.held.get_mut(&tenant) {
            m.remove(prefix);
            if m.is_empty() {
                self.held.remove(&tenant);
            }
        }
    }

    fn longest(map: &BTreeMap<Vec<char>, u64>, chars: &[char]) -> (usize, u64) {
        (1..=chars.len())
            .rev()
            .find_map(|k| map.get(&chars[..k]).map(|&t| (k, t)))
            .unwrap_or((0, 0))
    }

    pub(crate) fn tenant_matches(&self, text: &str) -> TenantMatches {
        let chars: Vec<char> = text.chars().collect();
        let tenants: Vec<TenantDepth> = self
            .held
            .iter()
            .map(|(&tenant, map)| {
                let (matched_chars, last_access) = Self::longest(map, &chars);
                TenantDepth {
                    tenant,
                    matched_chars,
                    last_access,
                }
            })
            .filter(|d| d.matched_chars > 0)
            .collect();
        TenantMatches {
            share: 0.0,
            matched_chars: tenants.iter().map(|d| d.matched_chars).max().unwrap_or(0),
            input_chars: chars.len(),
            tenants,
            trail: Default::default(),
        }
    }

    pub(crate) fn prefix_match(&self, text: &str) -> PrefixMatch {
        let chars: Vec<char> = text.chars().collect();
        let mut best = 0;
        let mut tenants = Vec::new();
        for (&tenant, map) in &self.held {
            let (m, last_access) = Self::longest(map, &chars);
            if m == 0 || m < best {
                continue;
            }
            if m > best {
                best = m;
                tenants.clear();
            }
            tenants.push(TenantHit {
                tenant,
                last_access,
            });
        }
        PrefixMatch {
            matched_chars: best,
            input_chars: chars.len(),
            tenants,
        }
    }

    pub(crate) fn prefix_match_for(&self, text: &str, tenant: TenantId) -> TenantMatch {
        let chars: Vec<char> = text.chars().collect();
        let matched_chars = self
            .held
            .get(&tenant)
            .map_or(0, |m| Self::longest(m, &chars).0);
        TenantMatch {
            matched_chars,
            input_chars: chars.len(),
        }
    }

    pub(crate) fn remove_tenant(&mut self, tenant: TenantId) {
        self.held.remove(&tenant);
    }

    pub(crate) fn tenant_size(&self, tenant: TenantId) -> usize {
        self.held.get(&tenant).map_or(0, BTreeMap::len)
    }

    pub(crate) fn tenants(&self) -> Vec<TenantId> {
        self.held.keys().copied().collect()
    }

    /// Returns the chars evicted.
    pub(crate) fn evict(&mut self, max: usize) -> usize {
        let mut evicted = 0;
        let tenants = self.tenants();
        for t in tenants {
            while self.tenant_size(t) > max {
                let (_, leaf) = oldest_leaf(&self.held[&t]).expect("non-empty map has a leaf");
                self.remove_prefix(t, &leaf);
                evicted += 1;
            }
        }
        evicted
    }

    /// Sum of tenant sizes.
    pub(crate) fn total(&self) -> usize {
        self.held.values().map(BTreeMap::len).sum()
    }

    /// Distinct prefixes over all tenants.
    pub(crate) fn distinct(&self) -> usize {
        let mut all: Vec<&Vec<char>> = self.held.values().flat_map(BTreeMap::keys).collect();
        all.sort();
        all.dedup();
        all.len()
    }

    /// Current logical clock (number of insert calls).
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }
}

/// The oldest prefix in `map` that has no held extension.
fn oldest_leaf(map: &BTreeMap<Vec<char>, u64>) -> Option<(u64, Vec<char>)> {
    let keys: Vec<&Vec<char>> = map.keys().collect();
    let mut best: Option<(u64, Vec<char>)> = None;
    for (i, k) in keys.iter().enumerate() {
        // In sorted order an extension of `k` sorts right after it.
        let is_leaf = keys.get(i + 1).is_none_or(|next| !next.starts_with(k));
        if is_leaf {
            let time = map[*k];
            if best.as_ref().is_none_or(|(t, _)| time < *t) {
                best = Some((time, (*k).clone()));
            }
        }
    }
    best
}
