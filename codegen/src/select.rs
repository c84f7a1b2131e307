//! Which kernels a planned graph needs on one device.
//!
//! The rule, from what the plan puts on the graph:
//! - **casts**: every `Cast`/`CastLike` between f32 and f16 (bf16) — and
//!   every node whose `precision` is f16 (bf16), since its inputs and
//!   outputs cross that boundary — brings the cast kernels of that format,
//!   both directions; so does every refreshed weight copy (the optimizer
//!   step rewrites it from its FP32 master with the f32 → f16/bf16 cast);
//! - **int8**: a `QuantizeLinear`/`DequantizeLinear`/`DynamicQuantizeLinear`
//!   node, or a node computing in i8/u8, brings the range reduction, int8
//!   parameter computation, quantize (nearest and stochastic) and dequantize
//!   kernels — symmetric always, asymmetric when a Q/DQ node has a zero-point
//!   input or the node computes in u8 (activations);
//! - **always**: what the runtime's gradient compression needs on every
//!   device whatever the plan — the two-stage range reduction, n-bit
//!   pack/unpack for 1, 2, 4 and 8 bits (nearest and stochastic), and the
//!   qgZ int4 path (int4 parameters, quantize, dequantize and
//!   dequantize-accumulate for int4 and int8 chunks).
//!
//! The result is deduplicated and in [`KernelSpec::all`]'s order, so the
//! emitted PTX is deterministic.

use qsync_ir::{DType, Graph, Op};
use qsync_kernels::{Half, KernelSpec, QBits, Rounding};

fn half_of(d: DType) -> Option<Half> {
    match d {
        DType::F16 => Some(Half::F16),
        DType::BF16 => Some(Half::BF16),
        _ => None,
    }
}

/// The kernels `graph` needs, by the rule in the module doc.
pub fn select_kernels(graph: &Graph) -> Vec<KernelSpec> {
    let mut want: Vec<KernelSpec> = Vec::new();
    let mut halves: Vec<Half> = Vec::new();
    let (mut int8, mut asym) = (false, false);
    halves.extend(graph.refreshed_copies().filter_map(|(c, _)| graph.ty(c).dtype.and_then(half_of)));
    for id in graph.schedule() {
        let node = graph.node(id);
        if let Some(h) = node.precision.and_then(half_of) {
            halves.push(h);
        }
        if matches!(node.precision, Some(DType::I8 | DType::U8)) {
            int8 = true;
            asym |= node.precision == Some(DType::U8);
        }
        match node.op {
            Op::Cast | Op::CastLike => {
                let tys = node.inputs().iter().flatten().chain(node.outputs()).filter_map(|&v| graph.ty(v).dtype);
                halves.extend(tys.filter_map(half_of));
            }
            Op::QuantizeLinear | Op::DequantizeLinear => {
                int8 = true;
                asym |= node.input(2).is_some();
            }
            Op::DynamicQuantizeLinear => {
                int8 = true;
                asym = true;
            }
            _ => {}
        }
    }
    for h in [Half::F16, Half::BF16] {
        if halves.contains(&h) {
            want.extend([KernelSpec::CastTo(h), KernelSpec::CastFrom(h)]);
        }
    }
    want.extend([KernelSpec::RowMinMax, KernelSpec::TensorMinMax]);
    if int8 {
        let syms: &[bool] = if asym { &[true, false] } else { &[true] };
        for &symmetric in syms {
            want.push(KernelSpec::QuantParams { bits: QBits::Int8, symmetric });
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                want.push(KernelSpec::QuantizeInt8 { symmetric, rounding });
            }
            want.push(KernelSpec::DequantizeInt8 { symmetric });
        }
    }
    want.push(KernelSpec::QuantParams { bits: QBits::Int4, symmetric: true });
    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
        want.push(KernelSpec::QuantizeInt4 { rounding });
    }
    want.push(KernelSpec::DequantizeInt4);
    for bits in [1, 2, 4, 8] {
        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
            want.push(KernelSpec::PackBits { bits, rounding });
        }
        want.push(KernelSpec::UnpackBits { bits });
    }
    want.extend([
        KernelSpec::DequantAccumulate { bits: QBits::Int8 },
        KernelSpec::DequantAccumulate { bits: QBits::Int4 },
    ]);
    KernelSpec::all().into_iter().filter(|k| want.contains(k)).collect()
}
