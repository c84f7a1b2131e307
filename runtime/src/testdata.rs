//! Reproducible synthetic gradients for tests and the benchmark: any rank's
//! gradient is a pure function of `(kind, n, seed, rank)`, so every rank can
//! rebuild every other rank's input and compute the exact mean itself.
//!
//! Kinds cover what breaks quantizers: Gaussian, heavy-tailed (symmetric
//! Pareto, α = 1.5: a few values dominate each group), all zero, tiny (1e-30:
//! below f16's subnormals), and Gaussian with rare large outliers.

use std::fmt;
use std::str::FromStr;

use qsync_kernels::rng;

/// A synthetic gradient distribution.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GradKind {
    Normal,
    HeavyTailed,
    Zeros,
    Tiny,
    Outliers,
}

impl GradKind {
    pub const ALL: [GradKind; 5] =
        [GradKind::Normal, GradKind::HeavyTailed, GradKind::Zeros, GradKind::Tiny, GradKind::Outliers];

    pub fn name(self) -> &'static str {
        match self {
            GradKind::Normal => "normal",
            GradKind::HeavyTailed => "heavy-tailed",
            GradKind::Zeros => "zeros",
            GradKind::Tiny => "tiny",
            GradKind::Outliers => "outliers",
        }
    }
}

impl fmt::Display for GradKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GradKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        GradKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown gradient kind `{s}` (known: normal, heavy-tailed, zeros, tiny, outliers)"))
    }
}

/// A uniform draw in (0, 1) with 53 bits.
fn unit(seed: u64, i: u64) -> f64 {
    ((rng::hash(seed, i) >> 11) as f64 + 0.5) * (1.0 / 9_007_199_254_740_992.0)
}

fn normal(seed: u64, i: u64) -> f64 {
    let (u, v) = (unit(seed, 2 * i), unit(seed, 2 * i + 1));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Rank `rank`'s gradient of `n` elements.
pub fn gradient(kind: GradKind, n: usize, seed: u64, rank: usize) -> Vec<f32> {
    let s = rng::hash(seed, 0x5eed_0000 + rank as u64);
    (0..n as u64)
        .map(|i| match kind {
            GradKind::Normal => (0.01 * normal(s, i)) as f32,
            GradKind::HeavyTailed => {
                let sign = if rng::hash(s ^ 1, i) & 1 == 0 { 1.0 } else { -1.0 };
                (sign * 0.001 * (unit(s, i).powf(-1.0 / 1.5) - 1.0)) as f32
            }
            GradKind::Zeros => 0.0,
            GradKind::Tiny => (1e-30 * normal(s, i)) as f32,
            GradKind::Outliers => {
                if rng::hash(s ^ 2, i).is_multiple_of(997) {
                    (1000.0 * normal(s ^ 3, i)) as f32
                } else {
                    (0.001 * normal(s, i)) as f32
                }
            }
        })
        .collect()
}

/// A 64-bit FNV-1a digest of f32 bit patterns (for bitwise comparisons
/// across ranks and runs).
pub fn digest(x: &[f32]) -> u64 {
    x.iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
