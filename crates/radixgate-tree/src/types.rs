//! Plain value types the tree hands in and out.

/// Identifies a tenant (a worker) in the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u32);

/// Settings of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeConfig {
    /// Hard bound on the characters attributed to all tenants together
    /// (the sum of every [`crate::Tree::tenant_size`]). An insert that takes
    /// the tree past it evicts least-recently-used leaves, across tenants,
    /// down to a low watermark of `max - max / 16`, so a burst of inserts pays
    /// for eviction in batches. Any value is valid; `usize::MAX` means none.
    ///
    /// The bound counts each node as [`Self::node_chars`] more characters
    /// (not the tenants' own sizes, which model what workers hold): a node
    /// costs far more memory than a character of its edge, and prompts
    /// crafted to add one-character leaves would otherwise take about 145
    /// bytes for each character the bound counts, against about 2 for real
    /// prompts.
    pub max_total_chars: usize,
    /// What the global bound counts a node as, in characters, besides its
    /// edge ([`DEFAULT_NODE_CHARS`] by default; 0 bounds characters alone).
    pub node_chars: usize,
}

/// A node's weight in the global bound: about what one costs (its slot,
/// holder and child vectors and edge allocation, ~145 bytes) over what a
/// character of real prompts costs (~2 bytes).
pub const DEFAULT_NODE_CHARS: usize = 64;

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            max_total_chars: usize::MAX,
            node_chars: DEFAULT_NODE_CHARS,
        }
    }
}

/// A tenant that holds the deepest matched node, with its recency there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantHit {
    /// The tenant.
    pub tenant: TenantId,
    /// Logical time of the tenant's last insert through that node (larger is newer).
    pub last_access: u64,
}

/// Result of [`crate::Tree::prefix_match`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Characters of the longest prefix of the text held by any tenant.
    pub matched_chars: usize,
    /// Characters in the text.
    pub input_chars: usize,
    /// Every tenant that holds the whole matched prefix, sorted by tenant id
    /// (empty if nothing matched).
    pub tenants: Vec<TenantHit>,
}

/// One tenant's own match of a text, as [`crate::Tree::tenant_matches`]
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantDepth {
    /// The tenant.
    pub tenant: TenantId,
    /// Characters of the longest prefix of the text the tenant holds (> 0).
    pub matched_chars: usize,
    /// Logical time of the tenant's last insert through the end of that
    /// prefix (larger is newer).
    pub last_access: u64,
}

/// Result of [`crate::Tree::tenant_matches`]: every tenant's own match of a
/// text, from one walk.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TenantMatches {
    /// The share of the tree's recent inserts that ran through the match
    /// (see [`crate::Tree::tenant_matches`]).
    pub share: f64,
    /// Characters of the longest prefix of the text held by any tenant.
    pub matched_chars: usize,
    /// Characters in the text.
    pub input_chars: usize,
    /// Every tenant that holds at least one character of the text's path,
    /// sorted by tenant id. A tenant not listed matches 0 characters.
    pub tenants: Vec<TenantDepth>,
    /// The walk's path, for [`crate::Tree::insert_matched`] (empty from
    /// anything but [`crate::Tree::tenant_matches`]).
    pub trail: crate::Trail,
}

impl TenantMatches {
    /// Characters of the text `tenant` holds (0 if none).
    pub fn matched_for(&self, tenant: TenantId) -> usize {
        self.get(tenant).map_or(0, |t| t.matched_chars)
    }

    /// The tenant's own match, if it holds any of the text.
    pub fn get(&self, tenant: TenantId) -> Option<&TenantDepth> {
        self.tenants
            .binary_search_by_key(&tenant, |t| t.tenant)
            .ok()
            .map(|k| &self.tenants[k])
    }
}

/// Result of [`crate::Tree::prefix_match_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TenantMatch {
    /// Characters of the longest prefix of the text held by the tenant.
    pub matched_chars: usize,
    /// Characters in the text.
    pub input_chars: usize,
}

/// What an eviction pass removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EvictionReport {
    /// Characters taken from tenants (summed over tenants).
    pub evicted_chars: usize,
}

/// Size figures of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeStats {
    /// Nodes, root excluded.
    pub nodes: usize,
    /// Distinct characters stored (shared prefixes counted once).
    pub chars: usize,
    /// Sum of every tenant's [`crate::Tree::tenant_size`].
    pub tenant_chars: usize,
    /// Estimated heap and inline bytes of the whole structure: node slots,
    /// edge bytes, child and holder vectors, tenant table and eviction logs,
    /// with 16 bytes of allocator overhead assumed per allocation.
    pub estimated_bytes: usize,
}
