//! The counter-based generator behind stochastic rounding: a splitmix64
//! finaliser of `seed + (index + 1) · φ`, so any element's draw is a pure
//! function of `(seed, index)` — reproducible, order-free, and the same on
//! every thread of every back end.

/// 2^64 / φ, the splitmix64 increment.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
pub const MIX1: u64 = 0xBF58_476D_1CE4_E5B9;
pub const MIX2: u64 = 0x94D0_49BB_1331_11EB;

/// 64 well-mixed bits for `(seed, index)`.
#[inline]
pub fn hash(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN));
    z = (z ^ (z >> 30)).wrapping_mul(MIX1);
    z = (z ^ (z >> 27)).wrapping_mul(MIX2);
    z ^ (z >> 31)
}

/// A uniform draw in `[0, 1)` with 24 bits: exact in `f32`.
#[inline]
pub fn uniform(seed: u64, index: u64) -> f32 {
    (hash(seed, index) >> 40) as f32 * (1.0 / 16_777_216.0)
}
