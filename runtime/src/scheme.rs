//! Synchronization schemes by name, and their settings.
//!
//! Names (what `qsyncc sync-bench --scheme` and `--sync` take):
//! `fp32`, `fp16`, `bf16`, `qgz-int8`, `qgz-int4`, `qgz-int8-hier`,
//! `qgz-int4-hier`, `qgz-intA-intB-hier` (intra-node width A, inter-node
//! width B), `nbit-1`, `nbit-2`, `nbit-4`, `nbit-8`; then optionally `-sr`
//! (stochastic rounding; quantized schemes only) and `-ef` (error feedback;
//! every scheme but `fp32`). Parsing and [`Scheme::name`] are inverse.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use qsync_kernels::{Half, QBits, Rounding};

use crate::error::SyncError;

/// What travels and how it is reduced.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The engine's own f32 all-reduce, divided by the world size.
    Fp32,
    /// Cast to 16 bits pre-divided by the world size, reduce-scatter and
    /// all-gather of 16-bit shards (f32 accumulation, one rounding).
    Half(Half),
    /// qgZ block quantization. `inter: None` is the one-shot all-to-all;
    /// `Some(bits)` the hierarchical form with that inter-node width.
    Qgz { intra: QBits, inter: Option<QBits> },
    /// TernGrad/HiPress min/max n-bit packing, all-gathered.
    NBit(u8),
}

/// A scheme: kind, rounding and error feedback.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Scheme {
    pub kind: Kind,
    pub rounding: Rounding,
    pub error_feedback: bool,
}

fn bits_name(b: QBits) -> &'static str {
    match b {
        QBits::Int8 => "int8",
        QBits::Int4 => "int4",
    }
}

fn parse_bits(s: &str) -> Option<QBits> {
    match s {
        "int8" => Some(QBits::Int8),
        "int4" => Some(QBits::Int4),
        _ => None,
    }
}

/// Bits per code of a quantized width.
pub fn code_bits(b: QBits) -> usize {
    match b {
        QBits::Int8 => 8,
        QBits::Int4 => 4,
    }
}

impl Scheme {
    /// Every base scheme name, in a fixed order (for listings and tests).
    pub const BASE_NAMES: [&'static str; 11] = [
        "fp32",
        "fp16",
        "bf16",
        "qgz-int8",
        "qgz-int4",
        "qgz-int8-hier",
        "qgz-int4-hier",
        "nbit-1",
        "nbit-2",
        "nbit-4",
        "nbit-8",
    ];

    pub fn name(&self) -> String {
        let mut s = match self.kind {
            Kind::Fp32 => "fp32".to_string(),
            Kind::Half(Half::F16) => "fp16".to_string(),
            Kind::Half(Half::BF16) => "bf16".to_string(),
            Kind::Qgz { intra, inter: None } => format!("qgz-{}", bits_name(intra)),
            Kind::Qgz { intra, inter: Some(inter) } if inter == intra => format!("qgz-{}-hier", bits_name(intra)),
            Kind::Qgz { intra, inter: Some(inter) } => format!("qgz-{}-{}-hier", bits_name(intra), bits_name(inter)),
            Kind::NBit(b) => format!("nbit-{b}"),
        };
        if self.rounding == Rounding::Stochastic {
            s.push_str("-sr");
        }
        if self.error_feedback {
            s.push_str("-ef");
        }
        s
    }

    /// Whether the scheme quantizes (so rounding applies).
    pub fn quantizes(&self) -> bool {
        matches!(self.kind, Kind::Qgz { .. } | Kind::NBit(_))
    }

    pub fn is_hierarchical(&self) -> bool {
        matches!(self.kind, Kind::Qgz { inter: Some(_), .. })
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Scheme {
    type Err = SyncError;

    fn from_str(name: &str) -> Result<Self, SyncError> {
        let bad =
            |why: &str| SyncError::BadScheme(format!("`{name}`: {why} (known: {})", Scheme::BASE_NAMES.join(", ")));
        let mut base = name;
        let (mut rounding, mut error_feedback) = (Rounding::Nearest, false);
        loop {
            if let Some(b) = base.strip_suffix("-ef").filter(|_| !error_feedback) {
                error_feedback = true;
                base = b;
            } else if let Some(b) = base.strip_suffix("-sr").filter(|_| rounding == Rounding::Nearest) {
                rounding = Rounding::Stochastic;
                base = b;
            } else {
                break;
            }
        }
        let kind = match base {
            "fp32" => Kind::Fp32,
            "fp16" => Kind::Half(Half::F16),
            "bf16" => Kind::Half(Half::BF16),
            _ => {
                if let Some(b) = base.strip_prefix("nbit-") {
                    match b {
                        "1" | "2" | "4" | "8" => Kind::NBit(b.parse().map_err(|_| bad("bad bit width"))?),
                        _ => return Err(bad("n-bit widths are 1, 2, 4 and 8")),
                    }
                } else if let Some(rest) = base.strip_prefix("qgz-") {
                    let parts: Vec<&str> = rest.split('-').collect();
                    match parts.as_slice() {
                        [b] => Kind::Qgz {
                            intra: parse_bits(b).ok_or_else(|| bad("qgZ widths are int8 and int4"))?,
                            inter: None,
                        },
                        [b, "hier"] => {
                            let w = parse_bits(b).ok_or_else(|| bad("qgZ widths are int8 and int4"))?;
                            Kind::Qgz { intra: w, inter: Some(w) }
                        }
                        [a, b, "hier"] => Kind::Qgz {
                            intra: parse_bits(a).ok_or_else(|| bad("qgZ widths are int8 and int4"))?,
                            inter: Some(parse_bits(b).ok_or_else(|| bad("qgZ widths are int8 and int4"))?),
                        },
                        _ => return Err(bad("unknown qgZ form")),
                    }
                } else {
                    return Err(bad("unknown scheme"));
                }
            }
        };
        let scheme = Scheme { kind, rounding, error_feedback };
        if rounding == Rounding::Stochastic && !scheme.quantizes() {
            return Err(bad("`-sr` applies to the quantized schemes (qgz-*, nbit-*)"));
        }
        if error_feedback && kind == Kind::Fp32 {
            return Err(bad("fp32 loses nothing, so `-ef` does not apply"));
        }
        Ok(scheme)
    }
}

/// How an all-reduce gathers the reduced shards of a qgZ reduce-scatter.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Gather {
    /// Requantized at the scheme's width (inter-node width when
    /// hierarchical): the wire-cheap default.
    Quantized,
    /// Exact f32 shards.
    F32,
}

/// Everything a [`crate::GradSync`] needs besides the communicator.
#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub scheme: Scheme,
    /// Elements per quantization group (one f32 scale each).
    pub group: usize,
    pub gather: Gather,
    /// Nodes the world is split into, equal and node-major (hierarchical
    /// qgZ; wire accounting): the convenience for clusters of equal nodes.
    pub nodes: usize,
    /// The node of every world rank (`node_of[r]`, ids `0..N`), for nodes
    /// of any size and any rank order; when set it defines the nodes and
    /// `nodes` must be 1 or its node count.
    pub node_of: Option<Vec<usize>>,
    /// Seeds stochastic rounding (with the step, stage, rank and shard).
    pub seed: u64,
    /// The deadline every communicator call gets.
    pub timeout: Duration,
    /// Where the quantization kernels run: the CPU reference (default) or
    /// our PTX on the communicator's GPU.
    pub kernels: crate::engine::Kernels,
    /// Elements per piece of a shard in the pipelined schemes (16-bit and
    /// one-shot qgZ, [`crate::sync`]'s `pipeline` module): each piece's
    /// kernels overlap the previous pieces' transfers. 0: one piece per
    /// shard. The result is the same bits whatever the value.
    pub pipeline_chunk: usize,
}

/// Default [`SyncConfig::pipeline_chunk`]: 256 Ki elements (1 MiB of f32),
/// small enough that a 64 MiB gradient on 4 ranks travels in 16 pieces, large
/// enough that each piece's messages stream at the link's rate.
pub const DEFAULT_PIPELINE_CHUNK: usize = 1 << 18;

impl SyncConfig {
    pub fn new(scheme: Scheme) -> Self {
        SyncConfig {
            scheme,
            group: 512,
            gather: Gather::Quantized,
            nodes: 1,
            node_of: None,
            seed: 0,
            timeout: Duration::from_secs(60),
            kernels: crate::engine::Kernels::Host,
            pipeline_chunk: DEFAULT_PIPELINE_CHUNK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for base in Scheme::BASE_NAMES.iter().copied().chain(["qgz-int4-int8-hier"]) {
            for suffix in ["", "-sr", "-ef", "-sr-ef"] {
                let name = format!("{base}{suffix}");
                match name.parse::<Scheme>() {
                    Ok(s) => assert_eq!(s.name(), name),
                    Err(e) => assert!(base.starts_with("fp") || base == "bf16", "{name}: {e}"),
                }
            }
        }
        assert_eq!("qgz-int4-int4-hier".parse::<Scheme>().map(|s| s.name()).ok().as_deref(), Some("qgz-int4-hier"));
        for bad in ["qgz-int2", "nbit-3", "fp16-sr", "fp32-ef", "hier", "qgz-int8-flat", ""] {
            assert!(bad.parse::<Scheme>().is_err(), "{bad} parsed");
        }
    }
}
