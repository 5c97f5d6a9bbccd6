//! `exp` for the forward pass: a Cephes-style polynomial (≈1 ulp over the
//! range used, inputs clamped to [-87, 88]). The constants are shared with the
//! SIMD versions, which compute the same polynomial 8 lanes at a time.

pub const EXP_MIN: f32 = -87.0;
pub const EXP_MAX: f32 = 88.0;
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
pub const LN2_HI: f32 = 0.693_359_4;
pub const LN2_LO: f32 = -2.121_944_4e-4;
pub const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// e^x by range reduction (x = n·ln2 + r) and a degree-7 polynomial in r.
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let n = (x * LOG2E).round_ties_even();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p * r + c;
    }
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}
