//! The crate's error type.
//!
//! The tree's operations cannot fail on any input (all text is valid UTF-8
//! by type, every bound is valid); the only error is a broken internal
//! invariant, reported by [`crate::Tree::check_invariants`] for tests.

/// Errors of the tree crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    /// An internal invariant does not hold: a bug in this crate.
    #[error("radix tree invariant violated: {0}")]
    InvariantViolated(String),
}
