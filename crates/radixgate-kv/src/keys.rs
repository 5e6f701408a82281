//! Block keys: our own chained hash of token ids.
//!
//! The key of block `i` is `next_key(key of block i-1, tokens of block i)`,
//! starting from [`root_key`] of the LoRA adapter (none for the base
//! model). A key therefore names a whole prefix, not one block: two
//! sequences share key `i` exactly when (up to hash collisions) they share
//! their first `i + 1` blocks. Computing keys from token ids, not taking the
//! engine's hashes, means the engine's hash algorithm and seed never
//! matter, and a request is keyed without asking any engine.
//!
//! The mixer is the 64x64→128-bit multiply folded to 64 bits (high xor
//! low), consuming 16 bytes (4 tokens) per multiply, with the running key
//! folded into every step. It is not keyed: someone who chooses prompts
//! could craft a collision with another prompt's key, which at worst routes
//! one request to a worker that lacks the prefix it was promised (a slower
//! request, never a wrong answer).

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;
const K4: u64 = 0x4528_21e6_38d0_1377;

#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The key before the first block: the base model's, or a LoRA adapter's.
pub fn root_key(lora_id: Option<i64>) -> u64 {
    match lora_id {
        None => K4,
        Some(id) => fold_mul(id as u64 ^ K2, K3),
    }
}

/// The key of a block whose predecessor's key is `parent`.
#[inline]
pub fn next_key(parent: u64, block: &[u32]) -> u64 {
    let mut h = parent;
    let mut chunks = block.chunks_exact(4);
    for c in &mut chunks {
        let a = u64::from(c[0]) | (u64::from(c[1]) << 32);
        let b = u64::from(c[2]) | (u64::from(c[3]) << 32);
        h = fold_mul(h ^ a ^ K0, b ^ K1);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u32; 4];
        w[..rest.len()].copy_from_slice(rest);
        let a = u64::from(w[0]) | (u64::from(w[1]) << 32);
        let b = u64::from(w[2]) | (u64::from(w[3]) << 32);
        h = fold_mul(h ^ a ^ K0, b ^ K1);
    }
    // The length goes in last, so blocks that differ only by trailing zero
    // tokens differ.
    fold_mul(h ^ block.len() as u64 ^ K2, K3)
}

/// The key of a block whose own key is `key` and that was computed with
/// extra keys whose digest is `extra` (see [`crate::BlockStored`]'s
/// `extra_keys`): apart from every key of tokens alone.
#[inline]
pub fn with_extra(key: u64, extra: u64) -> u64 {
    fold_mul(key ^ extra ^ K1, K4)
}

/// The keys of the full blocks of `tokens` for the base model; a trailing
/// partial block has no key. `block_size` 0 gives no keys.
pub fn block_keys(tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_keys_from(root_key(None), tokens, block_size)
}

/// The keys of the full blocks of `tokens`, chained from `parent` (a
/// [`root_key`] or the key of the block before `tokens`).
pub fn block_keys_from(parent: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut key = parent;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            key = next_key(key, block);
            key
        })
        .collect()
}

/// A 64-bit digest of bytes (an engine hash sent as bytes), seeded apart
/// from the key chain.
pub(crate) fn digest_bytes(bytes: &[u8]) -> u64 {
    let mut h = fold_mul(bytes.len() as u64 ^ K3, K0);
    let mut chunks = bytes.chunks_exact(16);
    for c in &mut chunks {
        let a = u64::from_le_bytes(c[..8].try_into().unwrap_or_default());
        let b = u64::from_le_bytes(c[8..].try_into().unwrap_or_default());
        h = fold_mul(h ^ a ^ K1, b ^ K2);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 16];
        w[..rest.len()].copy_from_slice(rest);
        let a = u64::from_le_bytes(w[..8].try_into().unwrap_or_default());
        let b = u64::from_le_bytes(w[8..].try_into().unwrap_or_default());
        h = fold_mul(h ^ a ^ K1, b ^ K2);
    }
    fold_mul(h ^ K4, K3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Keys name prefixes: two sequences share key i exactly when they
        /// share blocks 0..=i.
        #[test]
        fn keys_agree_exactly_on_shared_block_prefixes(
            a in proptest::collection::vec(0u32..6, 0..64),
            b in proptest::collection::vec(0u32..6, 0..64),
            block_size in 1usize..9,
        ) {
            let ka = block_keys(&a, block_size);
            let kb = block_keys(&b, block_size);
            prop_assert_eq!(ka.len(), a.len() / block_size);
            for i in 0..ka.len().min(kb.len()) {
                let same = a[..(i + 1) * block_size] == b[..(i + 1) * block_size];
                prop_assert_eq!(ka[i] == kb[i], same, "block {}", i);
            }
        }

        /// Keying the tail from the last key of the head gives the same
        /// keys as keying the whole.
        #[test]
        fn keys_chain_across_calls(
            tokens in proptest::collection::vec(any::<u32>(), 0..80),
            block_size in 1usize..9,
            split_blocks in 0usize..10,
        ) {
            let whole = block_keys(&tokens, block_size);
            let cut = (split_blocks * block_size).min(tokens.len() / block_size * block_size);
            let head = block_keys(&tokens[..cut], block_size);
            let parent = head.last().copied().unwrap_or(root_key(None));
            let tail = block_keys_from(parent, &tokens[cut..], block_size);
            prop_assert_eq!([head, tail].concat(), whole);
        }
    }

    #[test]
    fn lora_adapters_and_block_sizes_key_apart() {
        let tokens: Vec<u32> = (0..32).collect();
        let base = block_keys(&tokens, 16);
        let lora = block_keys_from(root_key(Some(7)), &tokens, 16);
        assert_ne!(base[0], lora[0]);
        assert_ne!(root_key(Some(7)), root_key(Some(8)));
        assert_ne!(block_keys(&tokens, 8)[0], base[0]);
        // A trailing zero token is not the same as no token.
        assert_ne!(next_key(0, &[1, 2, 3]), next_key(0, &[1, 2, 3, 0]));
        assert!(block_keys(&tokens, 0).is_empty());
        assert!(block_keys(&tokens[..15], 16).is_empty());
    }

    #[test]
    fn byte_digests_differ_by_content_and_length() {
        assert_ne!(digest_bytes(b""), digest_bytes(b"\0"));
        assert_ne!(digest_bytes(&[1; 32]), digest_bytes(&[1; 33]));
        assert_ne!(digest_bytes(&[1; 32]), digest_bytes(&[2; 32]));
        // The tail is zero-padded, so only the length tells these apart.
        assert_ne!(digest_bytes(&[0; 15]), digest_bytes(&[0; 16]));
    }
}
