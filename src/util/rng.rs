//! The one seeded random generator of sparkrt: sampling draws from it, and
//! the synthetic checkpoints and benchmark prompts are made with it.

/// The SplitMix64 generator (Steele, Lea & Flood, 2014): 64 bits of state,
/// good statistical quality, and a definition short enough to live here, so
/// a seed gives the same tokens across sparkrt versions and dependency
/// upgrades (a library generator may change its algorithm between releases).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published SplitMix64 output for seed 0 (the reference C code of
    /// Vigna's xoshiro page, used to seed xoshiro generators).
    #[test]
    fn splitmix64_matches_reference_output() {
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
        assert_eq!(rng.next_u64(), 0xf88b_b8a8_724c_81ec);
    }
}
