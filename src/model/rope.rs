//! Rotary position embedding frequencies: plain (qwen3_moe) and YaRN
//! (gpt_oss), as transformers computes them. The backend turns them into a
//! cos/sin table for each step's positions; the rotation is the neox
//! "rotate half" form for both architectures.

use std::f64::consts::PI;

/// YaRN parameters (docs/FORMATS.md, "RoPE of gpt_oss").
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub truncate: bool,
    pub original_max_position_embeddings: f64,
    /// Overrides `0.1 · ln(factor) + 1` when the config sets it.
    pub attention_factor: Option<f64>,
}

/// Frequencies and the factor cos/sin are multiplied by.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// `head_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

impl Rope {
    /// `inv_freq_j = θ^(−2j/d)`.
    pub fn plain(theta: f64, head_dim: usize) -> Rope {
        Rope {
            inv_freq: base_inv_freq(theta, head_dim).map(|f| f as f32).collect(),
            attention_factor: 1.0,
        }
    }

    /// YaRN: interpolated frequencies for long wavelengths, original ones for
    /// short, a linear ramp between the correction dimensions.
    pub fn yarn(theta: f64, head_dim: usize, y: &Yarn) -> Rope {
        let d = head_dim as f64;
        let correction_dim = |rotations: f64| {
            d * (y.original_max_position_embeddings / (2.0 * PI * rotations)).ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let high = high.min(d - 1.0);
        // transformers nudges a zero-width ramp to avoid dividing by zero.
        let width = if high == low { 0.001 } else { high - low };
        let inv_freq = base_inv_freq(theta, head_dim)
            .enumerate()
            .map(|(j, extrapolated)| {
                let interpolated = extrapolated / y.factor;
                let t = ((j as f64 - low) / width).clamp(0.0, 1.0);
                (interpolated * t + extrapolated * (1.0 - t)) as f32
            })
            .collect();
        Rope {
            inv_freq,
            attention_factor: y.attention_factor.unwrap_or(0.1 * y.factor.ln() + 1.0) as f32,
        }
    }
}

fn base_inv_freq(theta: f64, head_dim: usize) -> impl Iterator<Item = f64> {
    (0..head_dim / 2).map(move |j| 1.0 / theta.powf(2.0 * j as f64 / head_dim as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies() {
        let r = Rope::plain(10_000.0, 4);
        assert_eq!(r.inv_freq, vec![1.0, 0.01]);
        assert_eq!(r.attention_factor, 1.0);
    }

    #[test]
    fn yarn_ramps_between_correction_dims() {
        // gpt-oss-tiny: θ = 150000, d = 16, factor 32, β 32 / 1, orig 4096.
        let y = Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: false,
            original_max_position_embeddings: 4096.0,
            attention_factor: None,
        };
        let r = Rope::yarn(150_000.0, 16, &y);
        let c = |rot: f64| 16.0 * (4096.0 / (2.0 * PI * rot)).ln() / (2.0 * 150_000f64.ln());
        let (low, high) = (c(32.0).max(0.0), c(1.0).min(15.0));
        for j in 0..8 {
            let extra = 1.0 / 150_000f64.powf(2.0 * j as f64 / 16.0);
            let t = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let expected = extra / 32.0 * t + extra * (1.0 - t);
            assert!((r.inv_freq[j] as f64 - expected).abs() <= expected * 1e-6);
        }
        // j = 0 is below `low`: unscaled; the last is above `high`: ÷ factor.
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.attention_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
    }
}
