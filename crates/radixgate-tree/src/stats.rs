//! Size figures and the debug invariant check.
//!
//! Both walk every slot of the arena, so they are O(nodes): meant for
//! metrics scrapes, benchmarks and tests, not for the routing hot path.

use std::collections::HashMap;
use std::mem::size_of;

use crate::node::{Holder, NodeId, ROOT};
use crate::tenant::{LruEntry, TenantState};
use crate::tree::Inner;
use crate::{TenantId, TreeError, TreeStats};

/// Allocator bookkeeping assumed per heap allocation in the estimate.
const ALLOC_OVERHEAD: usize = 16;

impl Inner {
    pub(crate) fn stats(&self) -> TreeStats {
        let mut bytes = self.arena.own_bytes();
        for (id, n) in self.arena.slots() {
            if !self.arena.is_live(id) {
                continue;
            }
            let mut heap = [
                n.edge.len(),
                n.children.capacity() * size_of::<(char, NodeId)>(),
                if n.holders.spilled() {
                    n.holders.capacity() * size_of::<Holder>()
                } else {
                    0
                },
            ];
            for part in &mut heap {
                if *part > 0 {
                    *part += ALLOC_OVERHEAD;
                }
            }
            bytes += heap.iter().sum::<usize>();
        }
        bytes += self.tenants.capacity() * (size_of::<TenantId>() + size_of::<TenantState>() + 8);
        for state in self.tenants.values() {
            bytes += state.lru.capacity() * size_of::<LruEntry>() + ALLOC_OVERHEAD;
        }
        TreeStats {
            nodes: self.arena.live(),
            chars: self.stored_chars,
            tenant_chars: self.tenant_chars,
            estimated_bytes: bytes,
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), TreeError> {
        let fail = |what: String| Err(TreeError::InvariantViolated(what));
        let arena = &self.arena;
        let mut sizes: HashMap<TenantId, usize> = HashMap::new();
        let mut stored = 0usize;
        let mut live = 0usize;
        let root = &arena[ROOT];
        if !root.edge.is_empty() || !root.holders.is_empty() {
            return fail("root has an edge or holders".into());
        }
        for (id, n) in arena.slots() {
            if !arena.is_live(id) {
                if !n.children.is_empty() || !n.edge.is_empty() {
                    return fail(format!("free slot {id} keeps data"));
                }
                continue;
            }
            for w in n.children.windows(2) {
                if w[0].0 >= w[1].0 {
                    return fail(format!("children of {id} not sorted"));
                }
            }
            for &(c, child) in &n.children {
                let ch = &arena[child];
                if child == ROOT || !arena.is_live(child) || ch.parent != id {
                    return fail(format!("child {child} of {id} is dead or disowns it"));
                }
                if !ch.edge.starts_with(c) {
                    return fail(format!("child {child} of {id} filed under the wrong char"));
                }
            }
            if id == ROOT {
                continue;
            }
            live += 1;
            if n.edge.is_empty() || n.edge.chars().count() != n.edge_chars as usize {
                return fail(format!("node {id}: empty edge or wrong char count"));
            }
            stored += n.edge_chars as usize;
            let parent = &arena[n.parent];
            if parent.child(n.edge.chars().next().unwrap_or('\0')) != Some(id) {
                return fail(format!("node {id} missing from its parent's children"));
            }
            for w in n.holders.windows(2) {
                if w[0].tenant >= w[1].tenant {
                    return fail(format!("holders of {id} not sorted"));
                }
            }
            for h in &n.holders {
                *sizes.entry(h.tenant).or_default() += n.edge_chars as usize;
                let held = n
                    .children
                    .iter()
                    .filter(|&&(_, c)| arena[c].holds(h.tenant))
                    .count();
                if held != h.held_children as usize {
                    return fail(format!(
                        "node {id}: held_children of {:?} is wrong",
                        h.tenant
                    ));
                }
                if n.parent != ROOT {
                    match parent.holder(h.tenant) {
                        Some(p) if p.last_access >= h.last_access => {}
                        _ => {
                            return fail(format!(
                                "node {id}: {:?} holds it but not its parent, or the parent is older",
                                h.tenant
                            ));
                        }
                    }
                }
                if h.held_children == 0 {
                    let entry = LruEntry {
                        time: h.last_access,
                        node: id,
                        generation: n.generation,
                    };
                    let log = self.tenants.get(&h.tenant).map(|s| &s.lru);
                    if !log.is_some_and(|l| l.contains(&entry)) {
                        return fail(format!("leaf {id} of {:?} has no eviction entry", h.tenant));
                    }
                }
            }
        }
        if live != arena.live() || stored != self.stored_chars {
            return fail("live node or stored char counters drifted".into());
        }
        let mut total = 0;
        for (t, state) in &self.tenants {
            if sizes.get(t).copied().unwrap_or(0) != state.size || state.size == 0 {
                return fail(format!("size of {t:?} drifted (or kept at zero)"));
            }
            if state
                .lru
                .iter()
                .zip(state.lru.iter().skip(1))
                .any(|(a, b)| a.time > b.time)
            {
                return fail(format!("eviction log of {t:?} out of order"));
            }
            total += state.size;
        }
        if sizes.len() != self.tenants.len() || total != self.tenant_chars {
            return fail("tenant totals drifted".into());
        }
        Ok(())
    }
}
