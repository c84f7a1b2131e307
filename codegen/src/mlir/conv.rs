//! Convolutions over one to three spatial axes of NC… float tensors.
//!
//! `Conv` pads the spatial axes (`tensor.pad`; explicit `pads` or `SAME_*`)
//! and accumulates into the bias broadcast over the output
//! (`linalg.broadcast`) or zeros, in f32 for 16-bit floats (`acc_type`: the
//! named ops extend their inputs to the accumulator's type, the generics do
//! it with `arith.extf`) and rounded once to the output type at the end, as
//! cuDNN does with an f32 compute type; ungrouped through the named op of its rank
//! (`linalg.conv_1d_ncw_fcw`, `conv_2d_nchw_fchw`, `conv_3d_ncdhw_fcdhw`),
//! grouped 2-D through `linalg.conv_2d_ngchw_gfchw` on views split into
//! groups (`tensor.expand_shape`), grouped 1-D and 3-D — which have no named
//! op — through a `linalg.generic` on the same views.
//!
//! `ConvTranspose` (explicit `pads`, `VALID`, or pads from `output_shape`
//! or `SAME_*` as `transpose_pads` says; any strides, dilations,
//! `output_padding` and group; static spatial sizes) is a correlation, with
//! the kernel flipped and its channel axes swapped (a copying
//! `linalg.generic`), of the input spread out by the strides: inserted with
//! strides (`tensor.insert_slice`) into zeros that also hold (k − 1)·d − pad
//! of padding at each end, plus `output_padding` at the end. It accumulates
//! like `Conv`.

use qsync_ir::{DType, Dim, Node, Op, ValueId};

use super::build::{acc_type, Operand};
use super::nn::{dense_i64, window, WINDOW_LIMIT};
use super::{is_float, Emitter};

/// `shape` (N×C×…) with its channel axis split into `group` × `per`.
fn split(shape: &[Dim], group: i64, per: i64) -> Vec<Dim> {
    let mut v = vec![shape[0].clone(), Dim::from(group), Dim::from(per)];
    v.extend(shape[2..].iter().cloned());
    v
}

impl Emitter<'_> {
    /// `Conv` and `ConvTranspose`: the checks they share, then each.
    pub(super) fn conv(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let w = self.operand(node.input(1)?)?;
        let bias = self.optional_operand(node.input(2))?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let r = x.rank();
        let n = r.checked_sub(2)?;
        if outs.len() != 1 || !(1..=3).contains(&n) || oshape.len() != r || w.rank() != r {
            return None;
        }
        if x.dt != dt || w.dt != dt || !is_float(dt) || bias.as_ref().is_some_and(|b| b.dt != dt || b.rank() != 1) {
            return None;
        }
        let k: Vec<i64> = (2..r).map(|i| w.size(i)).collect::<Option<_>>()?;
        if k.iter().any(|v| !(1..=WINDOW_LIMIT).contains(v)) || node.attr_ints("kernel_shape").is_some_and(|ks| ks != k)
        {
            return None;
        }
        let s = window(node, "strides", n, Some(1))?;
        let d = window(node, "dilations", n, Some(1))?;
        let group = node.attr_int("group").unwrap_or(1);
        if group < 1 {
            return None;
        }
        // The accumulator (f32 for 16-bit floats): the bias or zeros.
        let acc = acc_type(dt);
        let init = match &bias {
            Some(b) => {
                let b = self.converted(b, acc)?;
                let e = self.empty(&oshape, acc, &[&x])?;
                let dims: Vec<String> = (0..r).filter(|&i| i != 1).map(|i| i.to_string()).collect();
                let name = self.line(format!(
                    "linalg.broadcast ins({} : {}) outs({} : {}) dimensions = [{}]",
                    b.name,
                    b.ty(),
                    e.name,
                    e.ty(),
                    dims.join(", ")
                ));
                Operand { name, ..e }
            }
            None => self.filled("0.0", &oshape, acc, &[&x])?,
        };
        let y = match node.op {
            Op::ConvTranspose => self.conv_transpose(node, &x, &w, &init, [&k, &s, &d], group)?,
            _ => self.conv_forward(node, &x, &w, &init, [&k, &s, &d], group)?,
        };
        let y = self.reshape(&y, &oshape)?;
        Some(vec![self.converted(&y, dt)?.name])
    }

    /// `Conv` into `init`; `ksd` = kernel sizes, strides, dilations.
    fn conv_forward(
        &mut self,
        node: &Node,
        x: &Operand,
        w: &Operand,
        init: &Operand,
        [k, s, d]: [&[i64]; 3],
        group: i64,
    ) -> Option<Operand> {
        let (lo, hi) = Self::pads_nd(node, x, k, s, d)?;
        let xp = self.pad_spatial(x, &lo, &hi, "0.0")?;
        let attrs = format!("{{dilations = {}, strides = {}, {}}}", dense_i64(d), dense_i64(s), self.tags(node));
        let n = k.len();
        if group == 1 {
            let op = ["linalg.conv_1d_ncw_fcw", "linalg.conv_2d_nchw_fchw", "linalg.conv_3d_ncdhw_fcdhw"][n - 1];
            return Some(self.named_conv(op, &attrs, &xp, w, init));
        }
        // Grouped: N×G×C/G×… against G×F/G×C/G×k….
        let (c, f) = (x.size(1)?, w.size(0)?);
        if c % group != 0 || f % group != 0 || w.size(1)? != c / group {
            return None;
        }
        let xg = self.reshape(&xp, &split(&xp.shape, group, c / group))?;
        let mut ws = vec![Dim::from(group), Dim::from(f / group)];
        ws.extend(w.shape[1..].iter().cloned());
        let wg = self.reshape(w, &ws)?;
        let og = self.reshape(init, &split(&init.shape, group, f / group))?;
        match n {
            2 => Some(self.named_conv("linalg.conv_2d_ngchw_gfchw", &attrs, &xg, &wg, &og)),
            _ => self.grouped_correlation(&xg, &wg, &og, s, d),
        }
    }

    /// `ConvTranspose` into `init`: the correlation of the strided, padded
    /// input with the flipped, channel-swapped kernel.
    fn conv_transpose(
        &mut self,
        node: &Node,
        x: &Operand,
        w: &Operand,
        init: &Operand,
        [k, s, d]: [&[i64]; 3],
        group: i64,
    ) -> Option<Operand> {
        let n = k.len();
        let extra = match node.attr_ints("output_padding") {
            None => vec![0; n],
            Some(v) if v.len() == n && v.iter().all(|&e| e >= 0) => v.to_vec(),
            Some(_) => return None,
        };
        let (begin, end) = Self::transpose_pads(node, x, [k, s, d], &extra)?;
        // W is C×F/G×k…; the output has G·F/G channels.
        let (c, fg) = (w.size(0)?, w.size(1)?);
        if x.size(1)? != c || c % group != 0 || init.size(1)? != fg * group {
            return None;
        }
        let mut spread = x.shape[..2].to_vec();
        let mut offsets = vec!["0".to_string(); 2];
        let batch = match x.size(0) {
            Some(b) => b.to_string(),
            None => self.dim(&x.shape[0].clone(), &[x])?,
        };
        let mut sizes = vec![batch, c.to_string()];
        for i in 0..n {
            // Checked: attributes and sizes come from the model.
            let reach = (k[i] - 1).checked_mul(d[i])?;
            let (lo, hi) = (reach - begin[i], (reach - end[i]).checked_add(extra[i])?);
            let size = x.size(2 + i)?;
            let full = (size - 1).checked_mul(s[i])?.checked_add(1)?.checked_add(lo)?.checked_add(hi)?;
            if lo < 0 || hi < 0 || init.size(2 + i)? != full - reach {
                return None;
            }
            spread.push(Dim::from(full));
            offsets.push(lo.to_string());
            sizes.push(size.to_string());
        }
        let zeros = self.filled("0.0", &spread, x.dt, &[x])?;
        let strides: Vec<String> = [1, 1].iter().chain(s).map(i64::to_string).collect();
        let name = self.line(format!(
            "tensor.insert_slice {} into {}[{}] [{}] [{}] : {} into {}",
            x.name,
            zeros.name,
            offsets.join(", "),
            sizes.join(", "),
            strides.join(", "),
            x.ty(),
            zeros.ty()
        ));
        let xs = Operand { name, ..zeros };
        let cg = c / group;
        let xg = self.reshape(&xs, &split(&xs.shape, group, cg))?;
        let mut ws = vec![Dim::from(group), Dim::from(cg)];
        ws.extend(w.shape[1..].iter().cloned());
        let wg = self.reshape(w, &ws)?;
        // G×C/G×F/G×k… → G×F/G×C/G×k…, each window reversed.
        let mut fshape = vec![Dim::from(group), Dim::from(fg), Dim::from(cg)];
        fshape.extend(k.iter().map(|&v| Dim::from(v)));
        let wf0 = self.empty(&fshape, w.dt, &[])?;
        let mut wmap = vec!["d0".to_string(), "d2".into(), "d1".into()];
        wmap.extend((0..n).map(|i| format!("{} - d{}", k[i] - 1, 3 + i)));
        let id: Vec<String> = (0..n + 3).map(|i| format!("d{i}")).collect();
        let wf = self.generic_op(&[(&wg, wmap)], &wf0, &id, &vec!["parallel"; n + 3], |_, a| a[0].clone());
        let og = self.reshape(init, &split(&init.shape, group, fg))?;
        self.grouped_correlation(&xg, &wf, &og, &vec![1; n], d)
    }

    /// The begin and end pads of a `ConvTranspose`: `pads` (or none), or,
    /// with `output_shape` or `auto_pad = SAME_*`, split from the total
    /// padding `s·(in − 1) + output_padding + (k − 1)·d + 1 − out` where
    /// `out` is `output_shape` (its spatial part) or, for `SAME_*` without
    /// it, `in·s`; `SAME_UPPER` puts the odd one at the end, `SAME_LOWER`
    /// and `NOTSET` at the beginning (the ONNX definition, which
    /// onnxruntime 1.23 follows in 1-D and 2-D). A negative total stays
    /// generic.
    fn transpose_pads(node: &Node, x: &Operand, [k, s, d]: [&[i64]; 3], extra: &[i64]) -> Option<(Vec<i64>, Vec<i64>)> {
        let n = k.len();
        let mode = node.attr_str("auto_pad").unwrap_or("NOTSET");
        let target: Option<Vec<i64>> = match node.attr_ints("output_shape") {
            Some(o) if o.len() == n => Some(o.to_vec()),
            Some(o) if o.len() == n + 2 => Some(o[2..].to_vec()),
            Some(_) => return None,
            None if matches!(mode, "SAME_UPPER" | "SAME_LOWER") => {
                Some((0..n).map(|i| x.size(2 + i)?.checked_mul(s[i])).collect::<Option<_>>()?)
            }
            None => None,
        };
        let Some(target) = target else {
            return match mode {
                "VALID" => Some((vec![0; n], vec![0; n])),
                "NOTSET" | "" => match node.attr_ints("pads") {
                    None => Some((vec![0; n], vec![0; n])),
                    Some(p) if p.len() == 2 * n && p.iter().all(|&v| v >= 0) => {
                        Some((p[..n].to_vec(), p[n..].to_vec()))
                    }
                    Some(_) => None,
                },
                _ => None,
            };
        };
        let upper = match mode {
            "SAME_UPPER" => true,
            "SAME_LOWER" | "NOTSET" | "" => false,
            _ => return None,
        };
        let (mut begin, mut end) = (vec![0; n], vec![0; n]);
        for i in 0..n {
            let size = x.size(2 + i)?;
            let span = (k[i] - 1).checked_mul(d[i])?.checked_add(1)?;
            let total =
                (size - 1).checked_mul(s[i])?.checked_add(extra[i])?.checked_add(span)?.checked_sub(target[i])?;
            if total < 0 || target[i] < 0 {
                return None;
            }
            let (small, big) = (total / 2, total - total / 2);
            (begin[i], end[i]) = if upper { (small, big) } else { (big, small) };
        }
        Some((begin, end))
    }

    /// A named convolution `op` of `x` and `w` accumulating into `init`
    /// (whose element type may be wider: the op extends its inputs to it).
    fn named_conv(&mut self, op: &str, attrs: &str, x: &Operand, w: &Operand, init: &Operand) -> Operand {
        let ty = init.ty();
        let name = self.line(format!(
            "{op} {attrs} ins({}, {} : {}, {}) outs({} : {ty}) -> {ty}",
            x.name,
            w.name,
            x.ty(),
            w.ty(),
            init.name
        ));
        Operand { name, ..init.clone() }
    }

    /// `init[n, g, f, o…] += Σ_c Σ_k x[n, g, c, o·s + k·d] · w[g, f, c, k]`
    /// as a `linalg.generic` (x N×G×C/G×…, w G×F/G×C/G×k…, init N×G×F/G×…),
    /// accumulating in `init`'s element type (`x` and `w` extended to it
    /// first, as the named ops do).
    fn grouped_correlation(
        &mut self,
        x: &Operand,
        w: &Operand,
        init: &Operand,
        s: &[i64],
        d: &[i64],
    ) -> Option<Operand> {
        let n = s.len();
        let k: Vec<i64> = (0..n).map(|i| w.size(3 + i)).collect::<Option<_>>()?;
        // The last window of each static axis must lie inside the input.
        for i in 0..n {
            if let (Some(p), Some(o)) = (x.size(3 + i), init.size(3 + i)) {
                let last = i128::from(o - 1) * i128::from(s[i]) + i128::from(k[i] - 1) * i128::from(d[i]);
                if o > 0 && last >= i128::from(p) {
                    return None;
                }
            }
        }
        // Loops: n, g, f, the output axes, c, the window axes.
        let c = format!("d{}", 3 + n);
        let win = |i: usize| format!("d{}", 4 + n + i);
        let mut xm = vec!["d0".to_string(), "d1".into(), c.clone()];
        xm.extend((0..n).map(|i| format!("d{} * {} + {} * {}", 3 + i, s[i], win(i), d[i])));
        let mut wm = vec!["d1".to_string(), "d2".into(), c];
        wm.extend((0..n).map(win));
        let om: Vec<String> = (0..n + 3).map(|i| format!("d{i}")).collect();
        let mut iters = vec!["parallel"; n + 3];
        iters.extend(vec!["reduction"; n + 1]);
        let (dt, xt, wt): (DType, DType, DType) = (init.dt, x.dt, w.dt);
        Some(self.generic_op(&[(x, xm), (w, wm)], init, &om, &iters, |b, a| {
            let xv = b.convert(&a[0], xt, dt);
            let wv = b.convert(&a[1], wt, dt);
            let p = b.bin("mulf", &xv, &wv, dt);
            b.bin("addf", &p, &a[2], dt)
        }))
    }
}
