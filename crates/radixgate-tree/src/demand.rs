//! How much of the recent traffic passes through a node: a count of the
//! inserts through it, decayed exponentially with the tree's logical clock
//! (one tick per insert), so that count over horizon estimates the share of
//! recent inserts whose text runs through the node. A router reads it to tell
//! a prefix that draws more requests than its holders can take (it should
//! spread) from one that does not (it should stay where it is).

use crate::node::Node;

/// The decay's time constant, in inserts: about the last 512 requests count.
const HORIZON: f64 = 512.0;

/// Below this decayed count a share is reported as 0: a few requests for one
/// document at a cold start say nothing about its share yet (three inserts
/// in a row decay to just under it: about four are needed).
const MIN_COUNT: f64 = 3.0;

/// `node`'s count decayed to `now`.
fn decayed(node: &Node, now: u64) -> f64 {
    // The clock's low 32 bits suffice: an age of 2^32 inserts has decayed
    // the count to nothing long before it wraps.
    let age = f64::from((now as u32).wrapping_sub(node.touched));
    f64::from(node.demand) * (-age / HORIZON).exp()
}

/// Counts one insert through `node` at `now`.
pub(crate) fn bump(node: &mut Node, now: u64) {
    node.demand = (decayed(node, now) + 1.0) as f32;
    node.touched = now as u32;
}

/// The share of recent inserts that went through `node`, as of `now`: its
/// decayed count over the decayed number of all inserts (`HORIZON` once the
/// clock is well past it, fewer before, so a young tree's shares are not
/// biased low). 0 while the count is under `MIN_COUNT`.
pub(crate) fn share(node: &Node, now: u64) -> f64 {
    let count = decayed(node, now);
    if count < MIN_COUNT {
        return 0.0;
    }
    let all = HORIZON * (1.0 - (-(now as f64) / HORIZON).exp());
    (count / all).min(1.0)
}
