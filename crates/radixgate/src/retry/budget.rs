//! The retry budget: how many retries the gateway sends, in all, against
//! the requests it is sent.
//!
//! `retry.max_retries` bounds the retries of one request; it does not bound
//! what they add up to. When most of the pool fails at once (an engine
//! version that crashes on load, a shared storage or network fault, every
//! worker shedding with 503), each request is sent `max_retries + 1` times,
//! and the load on the workers that are left, already too much for them,
//! is multiplied by that. The budget caps the sum: over the last
//! [`WINDOW_SECS`] seconds, retries may number at most `budget_percent` of
//! the requests that came in, plus `budget_min_per_sec` a second, so that
//! a quiet gateway still retries its few failures. A failure over the
//! budget is the request's answer, as when `max_retries` is spent.
//!
//! The rule is the one Finagle's retry budget states (retries as a share
//! of requests over a time window, with a floor); the code is our own.
//!
//! A retry is weighed when its attempt has failed, not when that attempt
//! was sent: a whole answer's first byte can come minutes after its send,
//! and the budget then says nothing of now. It is spent at once with the
//! check ([`RetryBudget::spend`]), so that the requests a crashing pool
//! fails together, all at one instant, do not all find the same room; a
//! retry spent but never sent (no worker left to take it) is given back.
//!
//! Counting is lock-free and approximate: one slot per second in a ring of
//! [`WINDOW_SECS`]; a slot found holding an older second is emptied by
//! whichever thread gets to it first, and a count racing with that reset
//! may be lost. A budget that is off by a request or two in a second is
//! still a budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Seconds of history the budget weighs.
pub(super) const WINDOW_SECS: u64 = 10;

/// One second's counts.
#[derive(Debug, Default)]
struct Slot {
    /// The second (since the budget began) counted here, plus one: 0 is a
    /// slot never used.
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

/// Retries against requests over the last [`WINDOW_SECS`] seconds.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    /// `None`: no budget (`retry.budget_percent` 0).
    limits: Option<Limits>,
    began: Instant,
    slots: [Slot; WINDOW_SECS as usize],
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    percent: u64,
    min_per_sec: u64,
}

impl RetryBudget {
    /// A budget of `percent` of the requests plus `min_per_sec` retries a
    /// second; `percent` 0 is no budget at all.
    pub(crate) fn new(percent: u32, min_per_sec: u32) -> Self {
        Self {
            limits: (percent > 0).then_some(Limits {
                percent: u64::from(percent),
                min_per_sec: u64::from(min_per_sec),
            }),
            began: Instant::now(),
            slots: Default::default(),
        }
    }

    /// A request came in: it adds to what may be retried.
    pub(crate) fn request(&self) {
        if self.limits.is_some() {
            self.slot(self.now())
                .requests
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One more retry, spent if it fits the budget now; `None` if it
    /// does not. Dropped unsent ([`Spent::sent`]), it is given back.
    pub(crate) fn spend(&self) -> Option<Spent<'_>> {
        if self.limits.is_none() {
            return Some(Spent {
                budget: self,
                tag: 0,
            });
        }
        if !self.has_room() {
            return None;
        }
        let now = self.now();
        self.slot(now).retries.fetch_add(1, Ordering::Relaxed);
        Some(Spent {
            budget: self,
            tag: now + 1,
        })
    }

    /// Whether one more retry fits the budget now.
    fn has_room(&self) -> bool {
        let Some(limits) = self.limits else {
            return true;
        };
        let now = self.now();
        let (mut requests, mut retries) = (0, 0);
        for slot in &self.slots {
            let second = slot.second.load(Ordering::Relaxed);
            if second != 0 && second - 1 + WINDOW_SECS > now {
                requests += slot.requests.load(Ordering::Relaxed);
                retries += slot.retries.load(Ordering::Relaxed);
            }
        }
        // retries < percent% of requests + the floor over the window, in
        // integers: 100 × retries < percent × requests + 100 × floor.
        100 * retries < limits.percent * requests + 100 * limits.min_per_sec * WINDOW_SECS
    }

    /// A retry sent that the budget does not weigh (one outside
    /// `retry.max_retries`): it spends from the budget all the same.
    pub(crate) fn retry(&self) {
        if self.limits.is_some() {
            self.slot(self.now())
                .retries
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn now(&self) -> u64 {
        self.began.elapsed().as_secs()
    }

    /// The slot of second `now`, emptied first if it holds an older one.
    fn slot(&self, now: u64) -> &Slot {
        let slot = &self.slots[(now % WINDOW_SECS) as usize];
        let tag = now + 1;
        let held = slot.second.load(Ordering::Relaxed);
        if held != tag
            && slot
                .second
                .compare_exchange(held, tag, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            slot.requests.store(0, Ordering::Relaxed);
            slot.retries.store(0, Ordering::Relaxed);
        }
        slot
    }
}

/// Whether a failed attempt is its request's last: its retries are spent
/// (`retry.max_retries`, or a stored response only its maker holds), or
/// the budget has no room for one more. Decided once, when the attempt
/// has failed in a way worth retrying ([`Verdict::last`]); the retry it
/// allows is spent then, and held until sent ([`Verdict::retry`]).
#[derive(Debug)]
pub(crate) struct Verdict<'a> {
    budget: &'a RetryBudget,
    retries_spent: bool,
    decided: bool,
    over_budget: bool,
    spent: Option<Spent<'a>>,
}

impl<'a> Verdict<'a> {
    /// The verdict on an attempt about to be sent; `retries_spent`: no
    /// retry is left to the request whatever the budget.
    pub(crate) fn new(budget: &'a RetryBudget, retries_spent: bool) -> Self {
        Self {
            budget,
            retries_spent,
            decided: false,
            over_budget: false,
            spent: None,
        }
    }

    /// Whether the attempt, now failed, is the request's last; the first
    /// call spends the retry the budget allows, later ones say the same.
    pub(crate) fn last(&mut self) -> bool {
        if !std::mem::replace(&mut self.decided, true) && !self.retries_spent {
            self.spent = self.budget.spend();
            self.over_budget = self.spent.is_none();
        }
        self.retries_spent || self.over_budget
    }

    /// Whether [`Verdict::last`] said so for want of budget alone.
    pub(crate) fn over_budget(&self) -> bool {
        self.over_budget
    }

    /// The retry spent for the next attempt, if one was.
    pub(crate) fn retry(self) -> Option<Spent<'a>> {
        self.spent
    }
}

/// A retry [`RetryBudget::spend`] allowed: given back when dropped
/// before [`Spent::sent`].
#[derive(Debug)]
#[must_use]
pub(crate) struct Spent<'a> {
    budget: &'a RetryBudget,
    /// The slot's tag of the second it was spent in; 0 with no budget or
    /// once sent.
    tag: u64,
}

impl Spent<'_> {
    /// The retry was sent: it stays spent.
    pub(crate) fn sent(mut self) {
        self.tag = 0;
    }
}

impl Drop for Spent<'_> {
    fn drop(&mut self) {
        if self.tag == 0 {
            return;
        }
        // Its second's slot, unless a later second has taken it over.
        let slot = &self.budget.slots[((self.tag - 1) % WINDOW_SECS) as usize];
        if slot.second.load(Ordering::Relaxed) == self.tag {
            let _ = slot
                .retries
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_a_share_of_requests_plus_a_floor() {
        // 20% and no floor: 10 requests allow 2 retries.
        let b = RetryBudget::new(20, 0);
        assert!(!b.has_room(), "no request, no floor: nothing to retry");
        for _ in 0..10 {
            b.request();
        }
        assert!(b.has_room());
        b.retry();
        assert!(b.has_room());
        b.retry();
        assert!(!b.has_room(), "2 retries of 10 requests is 20%");
        // The floor: 1 a second is 10 over the window, requests or none.
        let b = RetryBudget::new(20, 1);
        for _ in 0..10 {
            assert!(b.has_room());
            b.retry();
        }
        assert!(!b.has_room());
        b.request();
        b.request();
        b.request();
        b.request();
        b.request();
        assert!(b.has_room(), "5 requests add one retry");
        b.retry();
        assert!(!b.has_room());
    }

    /// A retry is spent as it is weighed, so that failures that come
    /// together do not all find the same room; one never sent is given
    /// back.
    #[test]
    fn a_retry_is_spent_as_it_is_weighed_and_given_back_unsent() {
        let b = RetryBudget::new(50, 0);
        for _ in 0..4 {
            b.request();
        }
        let first = b.spend().expect("room for 2 of 4");
        let second = b.spend().expect("room for 2 of 4");
        assert!(b.spend().is_none(), "both spent already");
        first.sent();
        drop(second);
        let again = b.spend().expect("the unsent one was given back");
        again.sent();
        assert!(b.spend().is_none());
        // With no budget, always; nothing to give back.
        let none = RetryBudget::new(0, 0);
        drop(none.spend().expect("no budget"));
    }

    #[test]
    fn no_budget_always_has_room() {
        let b = RetryBudget::new(0, 0);
        for _ in 0..1000 {
            b.retry();
        }
        assert!(b.has_room());
    }

    #[test]
    fn an_old_second_is_forgotten() {
        let b = RetryBudget::new(10, 0);
        b.request();
        for _ in 0..10 {
            b.slot(0).requests.fetch_add(1, Ordering::Relaxed);
        }
        b.slot(0).retries.fetch_add(1, Ordering::Relaxed);
        // The same slot, WINDOW_SECS later: emptied before it counts.
        let later = b.slot(WINDOW_SECS);
        assert_eq!(later.requests.load(Ordering::Relaxed), 0);
        assert_eq!(later.retries.load(Ordering::Relaxed), 0);
        assert_eq!(later.second.load(Ordering::Relaxed), WINDOW_SECS + 1);
    }
}
