//! Constant tensors: initializers, `Constant` payloads and tensor attributes.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::DType;

/// Where a tensor's bytes are.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum TensorData {
    /// Little-endian bytes in ONNX raw layout (4-bit types two a byte, bool
    /// one a byte). `Str` tensors hold each string as a u32 little-endian
    /// length followed by its bytes.
    Inline(Arc<[u8]>),
    /// Bytes in a separate file, resolved against the model's base directory.
    /// The file may be missing: then the values are absent but the dims are
    /// known, which is never an error.
    External { location: String, offset: u64, length: Option<u64> },
    /// Dims and dtype known, values not (e.g. an elided dump).
    Absent,
}

/// Whether `location` is one ONNX allows for external data: a non-empty
/// relative path of plain names (no root, drive, `.` or `..`).
pub fn check_external_location(location: &str) -> Result<(), String> {
    let p = Path::new(location);
    if location.is_empty() {
        return Err("external data location is empty".into());
    }
    if location.contains('\0') || p.is_absolute() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!(
            "external data location `{location}` is not a relative path inside the model's folder (ONNX requires one)"
        ));
    }
    Ok(())
}

/// Where the external data at `location` is, relative to the model's folder
/// `base` (the current directory when `None`): the path of an existing
/// regular file, or `None` when there is none (absent values, not an error).
/// Refused (an error saying why): a location [`check_external_location`]
/// refuses, and one that resolves — through symbolic links anywhere on the
/// way — outside the folder (both are canonicalized and compared by prefix).
pub fn resolve_external(base: Option<&Path>, location: &str) -> Result<Option<PathBuf>, String> {
    check_external_location(location)?;
    let base = base.filter(|b| !b.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(root) = base.canonicalize() else { return Ok(None) };
    let Ok(real) = base.join(location).canonicalize() else { return Ok(None) };
    if !real.starts_with(&root) {
        return Err(format!(
            "external data location `{location}` resolves outside the model's folder `{}` (to `{}`)",
            root.display(),
            real.display()
        ));
    }
    Ok(real.is_file().then_some(real))
}

/// A constant tensor.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Tensor {
    pub dtype: DType,
    pub dims: Vec<i64>,
    pub data: TensorData,
}

impl Tensor {
    pub fn numel(&self) -> u64 {
        // Saturating: dims come from files, and a product past u64 must not
        // wrap to a small count (callers compare it with the bytes present).
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64))
    }

    /// Bytes the values take in raw layout.
    pub fn byte_len(&self) -> u64 {
        self.dtype.storage_bytes(self.numel())
    }

    pub fn from_i64(dims: Vec<i64>, vals: &[i64]) -> Tensor {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { dtype: DType::I64, dims, data: TensorData::Inline(bytes.into()) }
    }

    pub fn from_f32(dims: Vec<i64>, vals: &[f32]) -> Tensor {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { dtype: DType::F32, dims, data: TensorData::Inline(bytes.into()) }
    }

    /// The inline bytes, if the values are held in memory.
    pub fn inline_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::Inline(b) => Some(b),
            _ => None,
        }
    }

    /// The bytes, reading external data relative to `base_dir`. `Ok(None)`
    /// when the values are absent (including a missing external file). A
    /// reference that [`Tensor::check_external`] refuses is an error
    /// (`InvalidData`), and nothing is read.
    pub fn load(&self, base_dir: Option<&Path>) -> std::io::Result<Option<Arc<[u8]>>> {
        match &self.data {
            TensorData::Inline(b) => Ok(Some(b.clone())),
            TensorData::Absent => Ok(None),
            TensorData::External { offset, .. } => {
                let refused = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
                let Some((path, len)) = self.check_external(base_dir).map_err(refused)? else { return Ok(None) };
                let Ok(file) = std::fs::File::open(&path) else { return Ok(None) };
                use std::io::{Read, Seek, SeekFrom};
                let mut file = file;
                file.seek(SeekFrom::Start(*offset))?;
                // `len` was checked against the file's size; the reader is
                // bounded by it all the same (the file may shrink meanwhile).
                let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
                file.take(len).read_to_end(&mut buf)?;
                if (buf.len() as u64) < len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{}: {} bytes at offset {offset}, {len} expected", path.display(), buf.len()),
                    ));
                }
                Ok(Some(buf.into()))
            }
        }
    }

    /// Check an external-data reference without reading it: its location
    /// (see [`resolve_external`]) and its sizes — a declared `length` must
    /// equal what the dims and dtype take, and `offset + length` must lie
    /// inside the file (overflow-checked). `Ok(None)` when the tensor is not
    /// external or its file is missing; otherwise the file's path and the
    /// number of bytes to read. The error says what is wrong with the
    /// reference (callers name the tensor).
    pub fn check_external(&self, base_dir: Option<&Path>) -> Result<Option<(PathBuf, u64)>, String> {
        let TensorData::External { location, offset, length } = &self.data else { return Ok(None) };
        let Some(path) = resolve_external(base_dir, location)? else { return Ok(None) };
        let need = self.byte_len();
        let len = match *length {
            // String tensors have no fixed byte size.
            Some(l) if self.dtype != DType::Str && l != need => {
                return Err(format!(
                    "external data `{location}` declares length {l} but the dims {:?} of {} need {need} bytes",
                    self.dims, self.dtype
                ))
            }
            Some(l) => l,
            None => need,
        };
        let size = std::fs::metadata(&path).map_err(|e| format!("external data `{location}`: {e}"))?.len();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(Some((path, len))),
            _ => Err(format!(
                "external data `{location}` declares {len} bytes at offset {offset} but the file holds {size} bytes"
            )),
        }
    }

    /// This tensor converted to float `to` as a Cast would (round to nearest
    /// even), reading external data relative to `base_dir`; when the values
    /// cannot be read, [`Tensor::absent_converted`].
    pub fn converted(&self, to: DType, base_dir: Option<&Path>) -> Tensor {
        let vals = self.load(base_dir).ok().flatten().and_then(|bytes| {
            Tensor { dtype: self.dtype, dims: self.dims.clone(), data: TensorData::Inline(bytes) }.as_f64s()
        });
        vals.and_then(|v| Tensor::from_f64s(to, self.dims.clone(), &v)).unwrap_or_else(|| self.absent_converted(to))
    }

    /// The converted copy of a tensor whose values are not at hand: absent
    /// like its source. A copy of external data is external data itself, in
    /// `{location}.{to}` at the source's offset scaled by the element sizes
    /// (rounded up, which keeps the copies of disjoint sources disjoint) —
    /// a file that is not written. An ONNX initializer must hold its values
    /// or reference them: one with neither fails `onnx.checker`. The name
    /// follows the master file, so the copies of one weights file never
    /// collide, and whoever has the weights can write the file by
    /// converting them (a trainer refreshes the copies from their masters
    /// anyway). A source without values or reference stays [`TensorData::Absent`].
    pub fn absent_converted(&self, to: DType) -> Tensor {
        let data = match &self.data {
            TensorData::External { location, offset, .. } => {
                let (from_bits, to_bits) = (u64::from(self.dtype.bits().max(1)), u64::from(to.bits().max(1)));
                TensorData::External {
                    location: format!("{location}.{to}"),
                    offset: (offset.saturating_mul(to_bits)).div_ceil(from_bits),
                    length: Some(to.storage_bytes(self.numel())),
                }
            }
            _ => TensorData::Absent,
        };
        Tensor { dtype: to, dims: self.dims.clone(), data }
    }

    /// Integer values widened to i64, when inline and of an integer or bool type.
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        let b = self.inline_bytes()?;
        let n = self.numel() as usize;
        let v: Vec<i64> = match self.dtype {
            DType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
            DType::U64 => {
                b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as i64).collect()
            }
            DType::I32 => {
                b.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect()
            }
            DType::U32 => {
                b.chunks_exact(4).map(|c| i64::from(u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect()
            }
            DType::I16 => {
                b.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes(c.try_into().unwrap_or([0; 2])))).collect()
            }
            DType::U16 => {
                b.chunks_exact(2).map(|c| i64::from(u16::from_le_bytes(c.try_into().unwrap_or([0; 2])))).collect()
            }
            DType::I8 => b.iter().map(|&x| i64::from(x as i8)).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&x| i64::from(x)).collect(),
            _ => return None,
        };
        (v.len() == n).then_some(v)
    }

    /// Float values widened to f64, when inline and of a float type.
    pub fn as_f64s(&self) -> Option<Vec<f64>> {
        let b = self.inline_bytes()?;
        let n = self.numel() as usize;
        let v: Vec<f64> = match self.dtype {
            DType::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
            DType::F32 => {
                b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect()
            }
            DType::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            DType::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            _ => return self.as_i64s().map(|v| v.into_iter().map(|x| x as f64).collect()),
        };
        (v.len() == n).then_some(v)
    }

    /// Build a tensor of `dtype` from f64 values (rounding as a cast would).
    pub fn from_f64s(dtype: DType, dims: Vec<i64>, vals: &[f64]) -> Option<Tensor> {
        let mut bytes = Vec::with_capacity(vals.len() * 8);
        for &v in vals {
            match dtype {
                DType::F64 => bytes.extend(v.to_le_bytes()),
                DType::F32 => bytes.extend((v as f32).to_le_bytes()),
                DType::F16 => bytes.extend(half::f16::from_f64(v).to_le_bytes()),
                DType::BF16 => bytes.extend(half::bf16::from_f64(v).to_le_bytes()),
                DType::I64 => bytes.extend((v as i64).to_le_bytes()),
                DType::U64 => bytes.extend((v as u64).to_le_bytes()),
                DType::I32 => bytes.extend((v as i32).to_le_bytes()),
                DType::U32 => bytes.extend((v as u32).to_le_bytes()),
                DType::I16 => bytes.extend((v as i16).to_le_bytes()),
                DType::U16 => bytes.extend((v as u16).to_le_bytes()),
                DType::I8 => bytes.push(v as i8 as u8),
                DType::U8 => bytes.push(v as u8),
                DType::Bool => bytes.push(u8::from(v != 0.0)),
                _ => return None,
            }
        }
        Some(Tensor { dtype, dims, data: TensorData::Inline(bytes.into()) })
    }

    /// Build from i64 values into an integer/bool dtype (wrapping as a cast would).
    pub fn from_i64s(dtype: DType, dims: Vec<i64>, vals: &[i64]) -> Option<Tensor> {
        if dtype.is_float() {
            return Tensor::from_f64s(dtype, dims, &vals.iter().map(|&v| v as f64).collect::<Vec<_>>());
        }
        let mut bytes = Vec::with_capacity(vals.len() * 8);
        for &v in vals {
            match dtype {
                DType::I64 | DType::U64 => bytes.extend(v.to_le_bytes()),
                DType::I32 | DType::U32 => bytes.extend((v as i32).to_le_bytes()),
                DType::I16 | DType::U16 => bytes.extend((v as i16).to_le_bytes()),
                DType::I8 | DType::U8 => bytes.push(v as u8),
                DType::Bool => bytes.push(u8::from(v != 0)),
                _ => return None,
            }
        }
        Some(Tensor { dtype, dims, data: TensorData::Inline(bytes.into()) })
    }
}

/// Check every external-data reference of `model` (initializers and tensor
/// attributes) with [`Tensor::check_external`] against its `base_dir`; the
/// first refused one is an error naming the initializer (or node and
/// attribute) and the location.
pub fn check_model_external_data(model: &crate::Model) -> Result<(), String> {
    let g = &model.graph;
    let base = model.base_dir.as_deref();
    let check = |t: &Tensor, what: &dyn Fn() -> String| match t.check_external(base) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{}: {e}", what())),
    };
    for &v in g.inits() {
        if let Some(t) = g.value(v).init() {
            check(t, &|| format!("initializer `{}`", g.value_name(v)))?;
        }
    }
    for n in g.node_ids() {
        let node = g.node(n);
        for (name, a) in &node.attrs {
            let what = || format!("node `{}` attribute `{name}`", node.name);
            match a {
                crate::Attr::Tensor(t) => check(t, &what)?,
                crate::Attr::Tensors(ts) => ts.iter().try_for_each(|t| check(t, &what))?,
                _ => {}
            }
        }
    }
    Ok(())
}
