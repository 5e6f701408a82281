//! A small, portable, seeded pseudo-random generator (SplitMix64) and key
//! derivation.
//!
//! Why our own: workloads must give the same requests for the same seed on
//! every machine and every version of every dependency, and the offline
//! simulator replays them; generic RNG crates do not promise stable streams
//! across releases. SplitMix64 is tiny, fast and statistically good enough
//! for load generation (it is not for cryptography).
//!
//! Text and per-session choices are drawn from [`key`]-derived streams, so a
//! conversation's text does not depend on the order replies arrive in.

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and mixed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives a well-mixed key from a seed and a list of parts (domain tag,
/// ids…). Equal inputs give equal keys; any change gives an unrelated key.
pub fn key(seed: u64, parts: &[u64]) -> u64 {
    let mut h = mix64(seed ^ GOLDEN);
    for (i, p) in parts.iter().enumerate() {
        h = mix64(h ^ p.wrapping_mul(GOLDEN).wrapping_add(i as u64 + 1));
    }
    h
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n` (`n > 0`), by multiply-high.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An exponentially distributed float with the given mean (0 gives 0).
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_keys_differ() {
        let a: Vec<u64> = (0..5)
            .map(|_| 0)
            .scan(SplitMix64::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..5)
            .map(|_| 0)
            .scan(SplitMix64::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(key(1, &[2, 3]), key(1, &[3, 2]));
        assert_ne!(key(1, &[2]), key(2, &[2]));
        assert_eq!(key(9, &[1, 2]), key(9, &[1, 2]));
    }

    #[test]
    fn below_and_unit_interval_stay_in_range() {
        let mut r = SplitMix64::new(3);
        for _ in 0..10_000 {
            assert!(r.below(7) < 7);
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        let mean: f64 = (0..20_000).map(|_| r.exp(2.0)).sum::<f64>() / 20_000.0;
        assert!((mean - 2.0).abs() < 0.1, "exp mean {mean}");
    }
}
