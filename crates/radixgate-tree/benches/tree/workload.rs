//! The benchmark workload: shared-prefix prompts, tree building with size
//! figures, and the naive baseline.

use std::time::{Duration, Instant};

use radixgate_tree::{TenantId, Tree, TreeConfig};

pub(crate) const SEED: u64 = 0x5EED_0F7E;
pub(crate) const SYSTEM_PROMPTS: usize = 32;
pub(crate) const TENANTS: u32 = 16;
pub(crate) const QUERIES: usize = 256;
pub(crate) const SIZES: [usize; 4] = [100, 1024, 4096, 16384];

pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Random text of at most `bytes` bytes (at least `bytes - 2`).
    pub(crate) fn text(&mut self, bytes: usize) -> String {
        let mut s = String::with_capacity(bytes + 4);
        while s.len() < bytes {
            let r = self.next();
            let c = match r % 64 {
                0 => '日',
                1 | 2 => 'é',
                3..=9 => ' ',
                _ => char::from(b'a' + ((r >> 8) % 26) as u8),
            };
            if s.len() + c.len_utf8() > bytes {
                break;
            }
            s.push(c);
        }
        s
    }
}

/// Prompts of about `p` bytes: system prompt `i % 32`, then a unique
/// suffix: `i`'s digits reversed (so the first suffix char varies fastest)
/// and a slice of a random pool at an offset that depends on `i`.
pub(crate) struct Workload {
    pub(crate) p: usize,
    pub(crate) systems: Vec<String>,
    pub(crate) pool: String,
    pub(crate) next: usize,
}

pub(crate) fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Workload {
    pub(crate) fn new(p: usize) -> Self {
        let mut rng = Rng(SEED ^ p as u64);
        let systems = (0..SYSTEM_PROMPTS).map(|_| rng.text(p / 2)).collect();
        let pool = rng.text((1 << 16) + p);
        Self {
            p,
            systems,
            pool,
            next: 0,
        }
    }

    /// A new prompt, its tenant, and where its 8 digits sit (see [`Self::stamp`]).
    pub(crate) fn template(&mut self) -> (String, TenantId, usize) {
        let at = self.systems[self.next % SYSTEM_PROMPTS].len();
        let (s, t) = self.prompt();
        (s, t, at)
    }

    /// Overwrites the 8 digits at `at` with `n` reversed: a new prompt on
    /// the same system prompt, made without allocating.
    pub(crate) fn stamp(text: &mut String, at: usize, n: usize) {
        let digits: [u8; 8] =
            std::array::from_fn(|k| b'0' + ((n / 10usize.pow(k as u32)) % 10) as u8);
        let digits = std::str::from_utf8(&digits).unwrap_or("00000000");
        text.replace_range(at..at + 8, digits);
    }

    /// The next prompt and the tenant it goes to.
    pub(crate) fn prompt(&mut self) -> (String, TenantId) {
        let i = self.next;
        self.next += 1;
        let system = &self.systems[i % SYSTEM_PROMPTS];
        let mut s = String::with_capacity(self.p);
        s.push_str(system);
        let digits: String = format!("{i:08}").chars().rev().collect();
        s.push_str(&digits);
        let rest = self.p.saturating_sub(s.len());
        let start = floor_boundary(&self.pool, (i * 7919) % (1 << 16));
        let end = floor_boundary(&self.pool, start + rest);
        s.push_str(&self.pool[start..end]);
        (s, TenantId((i % TENANTS as usize) as u32))
    }
}

/// A tree of about `chars` stored characters, the texts it got, and sample queries.
pub(crate) struct Built {
    pub(crate) tree: Tree,
    pub(crate) texts: Vec<(String, TenantId)>,
    pub(crate) queries: Vec<(String, TenantId)>,
    pub(crate) work: Workload,
}

pub(crate) fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<usize>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

pub(crate) fn build(p: usize, chars: usize, max_total: usize) -> Built {
    let mut work = Workload::new(p);
    let tree = Tree::new(TreeConfig {
        max_total_chars: max_total,
        ..TreeConfig::default()
    });
    let rss_before = rss_bytes();
    let mut texts = Vec::new();
    let mut took = Duration::ZERO;
    while tree.stats().chars < chars {
        let batch: Vec<(String, TenantId)> = (0..256).map(|_| work.prompt()).collect();
        let started = Instant::now();
        for (s, t) in &batch {
            tree.insert(s, *t);
        }
        took += started.elapsed();
        texts.extend(batch);
    }
    let stats = tree.stats();
    let text_bytes: usize = texts.iter().map(|(s, _)| s.capacity()).sum();
    // Only meaningful for the first tree of a process: later ones reuse
    // memory freed by earlier trees without growing the RSS.
    let rss = match rss_bytes()
        .saturating_sub(rss_before)
        .saturating_sub(text_bytes)
    {
        0 => "n/a (reused freed memory)".to_string(),
        r => format!("{:.2} B/char", r as f64 / stats.chars as f64),
    };
    println!(
        "built p={p} seed={SEED:#x}: {} prompts, {} nodes, {} stored chars, {} tenant chars, \
         estimated {:.2} B/char, RSS delta {rss} (minus the baseline's own copies), \
         build {:.0} ns/insert (generation excluded)",
        texts.len(),
        stats.nodes,
        stats.chars,
        stats.tenant_chars,
        stats.estimated_bytes as f64 / stats.chars as f64,
        took.as_nanos() as f64 / texts.len() as f64
    );
    let step = (texts.len() / QUERIES).max(1);
    let queries = texts.iter().step_by(step).take(QUERIES).cloned().collect();
    Built {
        tree,
        texts,
        queries,
        work,
    }
}

/// Bytes in common at the start of `a` and `b` (the naive baseline's compare;
/// slice equality on 32-byte blocks is the same trick the tree uses).
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 32 <= n && a[i..i + 32] == b[i..i + 32] {
        i += 32;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Naive baseline: longest common prefix over every inserted text.
pub(crate) fn naive_match(texts: &[(String, TenantId)], q: &str) -> (usize, Vec<TenantId>) {
    let mut best = 0;
    let mut who = Vec::new();
    for (s, t) in texts {
        let m = common_prefix(s.as_bytes(), q.as_bytes());
        if m > best {
            best = m;
            who.clear();
        }
        if m == best && m > 0 {
            who.push(*t);
        }
    }
    (best, who)
}
