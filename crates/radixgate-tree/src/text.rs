//! Byte-level text helpers for UTF-8 edges.
//!
//! The tree compares raw bytes (as fast as a `memcmp`) and only turns byte
//! offsets into character counts where a count is needed. Two facts make that
//! safe: equal byte prefixes of two valid UTF-8 strings have the same char
//! boundaries, and a mismatch inside a multi-byte character means that whole
//! character differs, so the match is cut back to the boundary before it.

/// Length in bytes of the longest common prefix of `a` and `b`.
///
/// Compares 32-byte blocks first (the compiler turns the array comparison into
/// vector compares), then finds the first differing byte with 8-byte XORs.
pub(crate) fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 32;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    for (x, y) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        if x != y {
            break;
        }
        i += BLOCK;
    }
    while i + 8 <= n {
        let x = u64::from_le_bytes(word(&a[i..i + 8]));
        let y = u64::from_le_bytes(word(&b[i..i + 8]));
        let diff = x ^ y;
        if diff != 0 {
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

fn word(bytes: &[u8]) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(bytes);
    w
}

/// The largest char boundary of `s` that is `<= i` (`i <= s.len()`).
pub(crate) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Byte offset of the `n`-th character of `s` (`s.len()` when `n` is the count).
pub(crate) fn byte_offset_of_char(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// The first character of a non-empty string.
pub(crate) fn first_char(s: &str) -> char {
    s.chars().next().unwrap_or('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_finds_first_difference_at_every_offset() {
        let a: Vec<u8> = (0..100u8).collect();
        for k in 0..100 {
            let mut b = a.clone();
            b[k] ^= 0xff;
            assert_eq!(common_prefix_len(&a, &b), k);
        }
        assert_eq!(common_prefix_len(&a, &a), 100);
        assert_eq!(common_prefix_len(&a[..37], &a), 37);
        assert_eq!(common_prefix_len(b"", &a), 0);
    }

    #[test]
    fn floor_boundary_backs_out_of_multibyte_chars() {
        let s = "aé日🙂";
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(floor_char_boundary(s, 4), 3);
        assert_eq!(floor_char_boundary(s, 5), 3);
        assert_eq!(floor_char_boundary(s, 10), 10);
        assert_eq!(byte_offset_of_char(s, 2), 3);
        assert_eq!(byte_offset_of_char(s, 4), s.len());
    }
}
