//! A tiny deterministic generator for surface variation.
//!
//! Written out here rather than taken from `rand` so that the variation a given seed produces
//! never changes with a dependency upgrade: recorded traces must stay reproducible.

/// FNV-1a over the parts, each followed by a 0xff separator, so ("ab","c") ≠ ("a","bc").
pub fn hash_parts(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The variation seed of one reply: the request's `seed`, the script key and the step.
pub fn variation_seed(request_seed: i64, script_key: &str, step: usize) -> u64 {
    hash_parts(&[
        &request_seed.to_le_bytes(),
        script_key.as_bytes(),
        &(step as u64).to_le_bytes(),
    ])
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, statistically fine for this purpose.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        lo + (self.next_u64() % ((hi - lo) as u64 + 1)) as usize
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    /// `n` lowercase hex digits.
    pub fn hex(&mut self, n: usize) -> String {
        let mut out = String::with_capacity(n);
        while out.len() < n {
            out.push_str(&format!("{:016x}", self.next_u64()));
        }
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        // Pinned so that an accidental change of the generator is caught.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn seeds_differ_by_key_and_step() {
        let a = variation_seed(1, "toolcaller/gaia-001/main", 0);
        assert_ne!(a, variation_seed(1, "toolcaller/gaia-001/main", 1));
        assert_ne!(a, variation_seed(2, "toolcaller/gaia-001/main", 0));
        assert_ne!(a, variation_seed(1, "toolcaller/gaia-002/main", 0));
        assert_ne!(hash_parts(&[b"ab", b"c"]), hash_parts(&[b"a", b"bc"]));
    }

    #[test]
    fn range_stays_in_bounds() {
        let mut r = SplitMix64::new(3);
        for _ in 0..1000 {
            let v = r.range(2, 5);
            assert!((2..=5).contains(&v));
        }
        assert_eq!(r.hex(20).len(), 20);
    }
}
