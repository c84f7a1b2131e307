//! `ScatterND` as an `scf.for` over the update rows that carries the output
//! tensor: row `i` reads its index tuple with `tensor.extract` (negative
//! indices wrapped), and writes its update — one element with
//! `tensor.insert`, or a slice with `tensor.insert_slice` — after combining
//! it with what is there for the `add`/`mul`/`max`/`min` reductions. Rows
//! run in order, so for `reduction = none` a later duplicate index wins
//! (ONNX leaves that case undefined).

use qsync_ir::{DType, Dim, Node, ValueId};

use super::build::{ranked, scf_for, Carried, Operand};
use super::{elem, is_float, Emitter};

/// The scalar `arith` op combining the old value with an update under
/// `reduction`: `Some(None)` for a plain write, `None` when the reduction
/// or the element type has no lowering.
fn combiner(reduction: &str, dt: DType) -> Option<Option<&'static str>> {
    let float = is_float(dt);
    let int = !float && !matches!(dt, DType::Bool | DType::Str);
    let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    Some(Some(match reduction {
        "none" => return (dt != DType::Str).then_some(None),
        "add" if float => "arith.addf",
        "mul" if float => "arith.mulf",
        "max" if float => "arith.maximumf",
        "min" if float => "arith.minimumf",
        "add" if int => "arith.addi",
        "mul" if int => "arith.muli",
        "max" if int => {
            if unsigned {
                "arith.maxui"
            } else {
                "arith.maxsi"
            }
        }
        "min" if int => {
            if unsigned {
                "arith.minui"
            } else {
                "arith.minsi"
            }
        }
        _ => return None,
    }))
}

impl Emitter<'_> {
    /// `ScatterND`: data of rank r, indices `[…, k]` (i32/i64, k static,
    /// 1 ≤ k ≤ r) and updates `indices.shape[:-1] ++ data.shape[k:]`.
    pub(super) fn scatter_nd(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let data = self.operand(node.input(0)?)?;
        let idx = self.operand(node.input(1)?)?;
        let upd = self.operand(node.input(2)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let m = idx.rank().checked_sub(1)?;
        let k = usize::try_from(idx.size(m)?).ok()?;
        let r = data.rank();
        if outs.len() != 1 || shape != data.shape || dt != data.dt || upd.dt != dt || !(1..=r).contains(&k) {
            return None;
        }
        if !matches!(idx.dt, DType::I64 | DType::I32) {
            return None;
        }
        let combine = combiner(node.attr_str("reduction").unwrap_or("none"), dt)?;
        let tail = &data.shape[k..];
        let mut want = idx.shape[..m].to_vec();
        want.extend(tail.iter().cloned());
        if upd.shape != want {
            return None;
        }
        // One row per index tuple: indices as rows × k, updates as rows × tail.
        let rows = idx.shape[..m].iter().fold(Dim::from(1), |p, d| p.mul(d));
        let idx2 = self.reshape(&idx, &[rows.clone(), Dim::from(k as i64)])?;
        let upd2 = self.reshape(&upd, &[vec![rows.clone()], tail.to_vec()].concat())?;
        let count = self.dim(&rows, &[&idx2, &upd2])?;
        let mut bounds = Vec::new();
        for d in &data.shape[..k] {
            bounds.push(self.dim(d, &[&data])?);
        }
        let tail_sizes = self.sizes(tail, &[&data])?;
        let cols: Vec<String> = (0..k).map(|j| self.scalar(&j.to_string(), "index")).collect();
        let (zero, one) = (self.scalar("0", "index"), self.scalar("1", "index"));
        let (row, acc) = (self.block_arg("row"), self.block_arg("acc"));
        let ty = data.ty();
        let (body, result) = self.region(|this| {
            let mut at = Vec::new();
            for (c, size) in cols.iter().zip(&bounds) {
                let v = this.line(format!("tensor.extract {}[{row}, {c}] : {}", idx2.name, idx2.ty()));
                at.push(this.wrap_index(&v, idx.dt, size));
            }
            if k == r {
                let u = this.line(format!("tensor.extract {}[{row}] : {}", upd2.name, upd2.ty()));
                let u = match combine {
                    None => u,
                    Some(op) => {
                        let old = this.line(format!("tensor.extract {acc}[{}] : {ty}", at.join(", ")));
                        this.line(format!("{op} {old}, {u} : {}", elem(dt)))
                    }
                };
                return Some(this.line(format!("tensor.insert {u} into {acc}[{}] : {ty}", at.join(", "))));
            }
            // The slice at `at` along the leading axes, whole along the tail.
            let slice_ty = ranked(tail, dt);
            let ones = vec!["1"; r].join(", ");
            let zeros = vec!["0"; r - k];
            let offsets = [at.clone(), zeros.iter().map(|z| z.to_string()).collect()].concat().join(", ");
            let sizes = [vec!["1".to_string(); k], tail_sizes.clone()].concat().join(", ");
            let uoffs = [vec![row.clone()], zeros.iter().map(|z| z.to_string()).collect()].concat().join(", ");
            let usizes = [vec!["1".to_string()], tail_sizes.clone()].concat().join(", ");
            let uones = vec!["1"; r - k + 1].join(", ");
            let u = this.line(format!(
                "tensor.extract_slice {}[{uoffs}] [{usizes}] [{uones}] : {} to {slice_ty}",
                upd2.name,
                upd2.ty()
            ));
            let u = match combine {
                None => u,
                Some(op) => {
                    let old = this
                        .line(format!("tensor.extract_slice {acc}[{offsets}] [{sizes}] [{ones}] : {ty} to {slice_ty}"));
                    let (o, n) = (
                        Operand { name: old, shape: tail.to_vec(), dt },
                        Operand { name: u, shape: tail.to_vec(), dt },
                    );
                    let e = elem(dt);
                    this.ewise(&[&o, &n], tail, dt, |b, a| b.op(format!("{op} {}, {} : {e}", a[0], a[1])))?.name
                }
            };
            Some(this.line(format!(
                "tensor.insert_slice {u} into {acc}[{offsets}] [{sizes}] [{ones}] : {slice_ty} into {ty}"
            )))
        })?;
        let carried = [Carried { name: &acc, init: &data.name, ty: &ty }];
        let name = self.line(scf_for(&row, [&zero, &count, &one], &carried, &body, &[&result]));
        Some(vec![name])
    }
}
