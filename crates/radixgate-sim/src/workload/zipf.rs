//! Zipf sampling over `n` ranks, by inverse transform on a precomputed CDF.
//!
//! Rank `k` (0-based) is drawn with probability proportional to
//! `1 / (k + 1)^s`. `s = 0` is uniform; `s ≈ 1` is the classic heavy head of
//! popular prefixes. Building costs O(n), each draw O(log n).

use super::rng::SplitMix64;

/// A Zipf distribution over `0..n`.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `0..n` with exponent `s` (`s ≥ 0`, checked by
    /// the callers' config validation; `n = 0` is treated as 1).
    pub fn new(n: u64, s: f64) -> Self {
        let n = n.max(1);
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    /// The probability of rank `k`.
    pub fn probability(&self, k: u64) -> f64 {
        let k = k as usize;
        let prev = if k == 0 { 0.0 } else { self.cdf[k - 1] };
        self.cdf[k] - prev
    }

    /// Draws a rank.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.next_f64();
        let i = self.cdf.partition_point(|&c| c <= u);
        i.min(self.cdf.len() - 1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(n: u64, s: f64, draws: usize) -> Vec<usize> {
        let z = Zipf::new(n, s);
        let mut rng = SplitMix64::new(11);
        let mut h = vec![0usize; n as usize];
        for _ in 0..draws {
            h[z.sample(&mut rng) as usize] += 1;
        }
        h
    }

    #[test]
    fn skew_one_follows_one_over_rank() {
        let draws = 200_000;
        let h = histogram(10, 1.0, draws);
        let z = Zipf::new(10, 1.0);
        for (k, &c) in h.iter().enumerate() {
            let expect = z.probability(k as u64) * draws as f64;
            assert!(
                (c as f64 - expect).abs() < 0.05 * expect + 50.0,
                "rank {k}: {c} vs {expect}"
            );
        }
        // rank 1 about twice rank 2, ten times rank 10
        let r12 = h[0] as f64 / h[1] as f64;
        let r110 = h[0] as f64 / h[9] as f64;
        assert!((r12 - 2.0).abs() < 0.15, "{r12}");
        assert!((r110 - 10.0).abs() < 1.0, "{r110}");
        assert!(h.windows(2).all(|w| w[0] > w[1]), "monotone: {h:?}");
    }

    #[test]
    fn skew_zero_is_uniform_and_probabilities_sum_to_one() {
        let h = histogram(8, 0.0, 80_000);
        for &c in &h {
            assert!((c as f64 - 10_000.0).abs() < 500.0, "{h:?}");
        }
        let z = Zipf::new(50, 1.3);
        let total: f64 = (0..50).map(|k| z.probability(k)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(Zipf::new(1, 2.0).sample(&mut SplitMix64::new(1)), 0);
    }
}
