//! Tensors of the archive: a [`TensorRef`] (storage, offset, sizes, strides)
//! becomes a contiguous IR [`Tensor`] read from `data/<key>`, bounds checked
//! against the storage. A missing storage gives a tensor whose values are
//! absent (dims and dtype still known), as for ONNX external data.

use qsync_ir::{Tensor, TensorData};

use crate::archive::Archive;
use crate::error::{Result, TsError};
use crate::pickle::TensorRef;

/// The most bytes a view may materialise beyond its storage's size: views
/// that repeat storage elements (zero strides, as `expand` makes, or
/// overlapping strides) are copied out element by element, and a declared
/// size far beyond the storage must not drive an allocation. A view within
/// its storage's size is never limited (the storage is in memory already).
pub const MAX_EXPANDED_VIEW_BYTES: u64 = 256 << 20;

/// Read a tensor's values, made contiguous. The view (storage offset, sizes,
/// strides — zero, negative and overlapping strides included) is checked
/// with overflow-checked arithmetic before anything is allocated: every
/// element it reaches must lie in the storage, and the materialised bytes
/// must fit the storage or [`MAX_EXPANDED_VIEW_BYTES`].
pub fn load_tensor(ar: &Archive, t: &TensorRef) -> Result<Tensor> {
    let dtype = t.storage.dtype;
    let dims = t.sizes.clone();
    let member = format!("data/{}", t.storage.key);
    let bad = |msg: String| TsError::Invalid { file: ar.label.clone(), msg: format!("{member}: {msg}") };
    if t.sizes.len() != t.strides.len() {
        return Err(bad(format!("tensor view has {} sizes but {} strides", t.sizes.len(), t.strides.len())));
    }
    if let Some(d) = t.sizes.iter().find(|&&d| d < 0) {
        return Err(bad(format!("tensor view has a negative size {d}")));
    }
    if t.offset < 0 {
        return Err(bad(format!("tensor view has a negative storage offset {}", t.offset)));
    }
    let numel =
        t.sizes.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)).ok_or_else(|| bad("size overflows".into()))?;
    let Some(bytes) = ar.get(&member) else { return Ok(Tensor { dtype, dims, data: TensorData::Absent }) };
    let es = dtype.storage_bytes(1).max(1);
    if numel == 0 {
        return Ok(Tensor { dtype, dims, data: TensorData::Inline(Vec::new().into()) });
    }
    let avail = bytes.len() as u64 / es;
    // The lowest and highest elements the view reaches.
    let (mut lo, mut hi) = (i128::from(t.offset), i128::from(t.offset));
    for (&s, &st) in t.sizes.iter().zip(&t.strides) {
        let span = i128::from(s - 1).checked_mul(i128::from(st)).ok_or_else(|| bad("strides overflow".into()))?;
        if span < 0 {
            lo = lo.checked_add(span).ok_or_else(|| bad("strides overflow".into()))?;
        } else {
            hi = hi.checked_add(span).ok_or_else(|| bad("strides overflow".into()))?;
        }
    }
    if lo < 0 {
        return Err(bad(format!("tensor view reaches element {lo}, before the storage's start")));
    }
    if hi >= i128::from(avail) {
        return Err(bad(format!("tensor view reaches element {hi} but the storage holds {avail}")));
    }
    let out_bytes = numel.checked_mul(es).ok_or_else(|| bad("size overflows".into()))?;
    if out_bytes > bytes.len() as u64 && out_bytes > MAX_EXPANDED_VIEW_BYTES {
        return Err(bad(format!(
            "tensor view of sizes {:?} and strides {:?} repeats its {avail}-element storage into {out_bytes} bytes, \
             above the limit of {MAX_EXPANDED_VIEW_BYTES} bytes for expanded views",
            t.sizes, t.strides
        )));
    }
    let es = es as usize;
    let mut contiguous = true;
    let mut expect = 1i64;
    for (&s, &st) in t.sizes.iter().zip(&t.strides).rev() {
        if s != 1 && st != expect {
            contiguous = false;
        }
        expect = expect.saturating_mul(s);
    }
    // Every element index below is in 0..avail (checked above).
    let off = t.offset as usize * es;
    let data: Vec<u8> = if contiguous {
        bytes[off..off + out_bytes as usize].to_vec()
    } else {
        let mut out = Vec::with_capacity(out_bytes as usize);
        let rank = t.sizes.len();
        let mut idx = vec![0i64; rank];
        for _ in 0..numel {
            let e = t.offset + idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum::<i64>();
            let b = e as usize * es;
            out.extend_from_slice(&bytes[b..b + es]);
            for ax in (0..rank).rev() {
                idx[ax] += 1;
                if idx[ax] < t.sizes[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
        out
    };
    Ok(Tensor { dtype, dims, data: TensorData::Inline(data.into()) })
}
