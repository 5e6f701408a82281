//! The radixgate gateway: the HTTP router in front of a pool of LLM workers.

pub mod inspect;
