//! Tensors of the archive: a [`TensorRef`] (storage, offset, sizes, strides)
//! becomes a contiguous IR [`Tensor`] read from `data/<key>`, bounds checked
//! against the storage. A missing storage gives a tensor whose values are
//! absent (dims and dtype still known), as for ONNX external data.

use qsync_ir::{Tensor, TensorData};

use crate::archive::Archive;
use crate::error::{Result, TsError};
use crate::pickle::TensorRef;

/// Read a tensor's values, made contiguous.
pub fn load_tensor(ar: &Archive, t: &TensorRef) -> Result<Tensor> {
    let dtype = t.storage.dtype;
    let dims = t.sizes.clone();
    let member = format!("data/{}", t.storage.key);
    let bad = |msg: String| TsError::Invalid { file: ar.label.clone(), msg: format!("{member}: {msg}") };
    let Some(bytes) = ar.get(&member) else { return Ok(Tensor { dtype, dims, data: TensorData::Absent }) };
    let es = usize::try_from(dtype.storage_bytes(1)).unwrap_or(0).max(1);
    let numel = t
        .sizes
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d.max(0) as u64))
        .ok_or_else(|| bad("size overflows".into()))?;
    if numel == 0 {
        return Ok(Tensor { dtype, dims, data: TensorData::Inline(Vec::new().into()) });
    }
    let avail = (bytes.len() / es) as u64;
    let last = t
        .sizes
        .iter()
        .zip(&t.strides)
        .try_fold(t.offset as u64, |a, (&s, &st)| {
            (s.max(1) as u64 - 1).checked_mul(st as u64).and_then(|x| a.checked_add(x))
        })
        .ok_or_else(|| bad("strides overflow".into()))?;
    if last >= avail {
        return Err(bad(format!("tensor view reaches element {last} but the storage holds {avail}")));
    }
    let mut contiguous = true;
    let mut expect = 1i64;
    for (&s, &st) in t.sizes.iter().zip(&t.strides).rev() {
        if s != 1 && st != expect {
            contiguous = false;
        }
        expect = expect.saturating_mul(s);
    }
    let off = t.offset as usize * es;
    let data: Vec<u8> = if contiguous {
        bytes[off..off + numel as usize * es].to_vec()
    } else {
        let mut out = Vec::with_capacity(numel as usize * es);
        let rank = t.sizes.len();
        let mut idx = vec![0i64; rank];
        for _ in 0..numel {
            let e: i64 = t.offset + idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum::<i64>();
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
