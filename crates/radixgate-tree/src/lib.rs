//! The approximate multi-tenant radix tree that cache-aware routing is built on.
//!
//! One [`Tree`] records, for many tenants (workers), which request texts were
//! sent to them. It answers "which tenant most likely still holds the longest
//! prefix of this text in its KV cache?" without a tokenizer: it stores raw
//! Unicode characters and every count it reports is in characters.
//!
//! This first version is a deliberately naive reference implementation that
//! fixes the public API; the compressed radix tree replaces its internals.

#![allow(missing_docs)]

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies a tenant (a worker) in the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u32);

/// Settings of a tree.
#[derive(Clone, Debug)]
pub struct TreeConfig {
    /// Hard bound on the characters attributed to all tenants together;
    /// an insert that would exceed it first evicts least-recently-used leaves.
    pub max_total_chars: usize,
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            max_total_chars: usize::MAX,
        }
    }
}

/// A tenant that holds the deepest matched node, with its recency there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantHit {
    pub tenant: TenantId,
    /// Logical time of the tenant's last insert through that node (larger is newer).
    pub last_access: u64,
}

/// Result of [`Tree::prefix_match`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Characters of the longest prefix of the text held by any tenant.
    pub matched_chars: usize,
    /// Characters in the text.
    pub input_chars: usize,
    /// Every tenant that holds the whole matched prefix (empty if nothing matched).
    pub tenants: Vec<TenantHit>,
}

/// Result of [`Tree::prefix_match_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TenantMatch {
    pub matched_chars: usize,
    pub input_chars: usize,
}

/// What an eviction pass removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EvictionReport {
    pub evicted_chars: usize,
}

/// Size figures of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeStats {
    pub nodes: usize,
    /// Distinct characters stored (shared prefixes counted once).
    pub chars: usize,
    /// Sum of every tenant's [`Tree::tenant_size`].
    pub tenant_chars: usize,
    pub estimated_bytes: usize,
}

/// The multi-tenant tree. `Send + Sync`; share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct Tree {
    config: TreeConfig,
    clock: AtomicU64,
    /// tenant -> held texts (each also holds all its prefixes) with last access.
    held: RwLock<HashMap<TenantId, Vec<Held>>>,
}

/// A held text (which also holds all its prefixes) and its last access.
type Held = (Vec<char>, u64);

fn common_prefix(a: &[char], b: &[char]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Distinct non-empty prefixes of a set of strings.
fn distinct_prefixes(texts: &[(Vec<char>, u64)]) -> usize {
    let mut sorted: Vec<&Vec<char>> = texts.iter().map(|(t, _)| t).collect();
    sorted.sort();
    let mut total = 0;
    for (i, t) in sorted.iter().enumerate() {
        let lcp = if i == 0 {
            0
        } else {
            common_prefix(sorted[i - 1], t)
        };
        total += t.len() - lcp;
    }
    total
}

impl Tree {
    pub fn new(config: TreeConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    pub fn insert(&self, text: &str, tenant: TenantId) {
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        let chars: Vec<char> = text.chars().collect();
        let mut held = self.held.write();
        held.entry(tenant).or_default().push((chars, now));
        let total: usize = held.values().map(|t| distinct_prefixes(t)).sum();
        if total > self.config.max_total_chars {
            drop(held);
            self.evict_global(self.config.max_total_chars);
        }
    }

    pub fn prefix_match(&self, text: &str) -> PrefixMatch {
        let chars: Vec<char> = text.chars().collect();
        let held = self.held.read();
        let mut best = 0;
        let mut tenants: Vec<TenantHit> = Vec::new();
        for (&tenant, texts) in held.iter() {
            let (m, at) = texts
                .iter()
                .map(|(t, at)| (common_prefix(t, &chars), *at))
                .fold((0, 0), |acc, (m, at)| match m.cmp(&acc.0) {
                    std::cmp::Ordering::Greater => (m, at),
                    std::cmp::Ordering::Equal => (m, acc.1.max(at)),
                    std::cmp::Ordering::Less => acc,
                });
            if m == 0 {
                continue;
            }
            if m > best {
                best = m;
                tenants.clear();
            }
            if m == best {
                tenants.push(TenantHit {
                    tenant,
                    last_access: at,
                });
            }
        }
        PrefixMatch {
            matched_chars: best,
            input_chars: chars.len(),
            tenants,
        }
    }

    pub fn prefix_match_for(&self, text: &str, tenant: TenantId) -> TenantMatch {
        let chars: Vec<char> = text.chars().collect();
        let held = self.held.read();
        let matched = held
            .get(&tenant)
            .map(|t| {
                t.iter()
                    .map(|(t, _)| common_prefix(t, &chars))
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        TenantMatch {
            matched_chars: matched,
            input_chars: chars.len(),
        }
    }

    pub fn remove_tenant(&self, tenant: TenantId) {
        self.held.write().remove(&tenant);
    }

    pub fn tenant_size(&self, tenant: TenantId) -> usize {
        self.held
            .read()
            .get(&tenant)
            .map(|t| distinct_prefixes(t))
            .unwrap_or(0)
    }

    /// Evicts least-recently-used entries until every tenant holds at most
    /// `max_chars_per_tenant` characters.
    pub fn evict(&self, max_chars_per_tenant: usize) -> EvictionReport {
        let mut held = self.held.write();
        let mut evicted = 0;
        for texts in held.values_mut() {
            let before = distinct_prefixes(texts);
            texts.sort_by_key(|(_, at)| *at);
            while distinct_prefixes(texts) > max_chars_per_tenant {
                texts.remove(0);
            }
            evicted += before - distinct_prefixes(texts);
        }
        held.retain(|_, t| !t.is_empty());
        EvictionReport {
            evicted_chars: evicted,
        }
    }

    fn evict_global(&self, max_total: usize) {
        let mut held = self.held.write();
        loop {
            let total: usize = held.values().map(|t| distinct_prefixes(t)).sum();
            if total <= max_total {
                break;
            }
            let oldest = held
                .iter()
                .filter_map(|(k, t)| t.iter().map(|(_, at)| *at).min().map(|at| (at, *k)))
                .min();
            let Some((at, tenant)) = oldest else { break };
            if let Some(texts) = held.get_mut(&tenant) {
                texts.retain(|(_, a)| *a != at);
            }
        }
        held.retain(|_, t| !t.is_empty());
    }

    pub fn stats(&self) -> TreeStats {
        let held = self.held.read();
        let all: Vec<(Vec<char>, u64)> = held.values().flatten().cloned().collect();
        let chars = distinct_prefixes(&all);
        let tenant_chars = held.values().map(|t| distinct_prefixes(t)).sum();
        TreeStats {
            nodes: all.len(),
            chars,
            tenant_chars,
            estimated_bytes: chars * 4,
        }
    }
}
