"""Applying a qsync plan to a PyTorch module.

The plan directory is read by `Plan` (`_manifest.py`, which needs no
PyTorch; `qsync.plan.Plan` is the same class); this module is the part of
the package that needs PyTorch to apply it.

`apply_plan(module, plan_dir, device_type)` makes each planned operator
compute at its precision, with the dtypes the plan executes:

- an operator that is a whole leaf module (Conv, Linear, LayerNorm, ...)
  runs that module with its inputs cast to the precision and its weights
  read at it: a weight the plan keeps as a *refreshed copy*
  (`refreshed_copies` in plan.json) is held in the low precision between
  steps and rewritten from its FP32 master by `ApplyReport.refresh()` after
  each optimizer step (`apply_plan(..., optimizer=opt)` or
  `report.attach(opt)` registers that as the optimizer's step post-hook;
  a copy whose master changed some other way — DDP's initial broadcast, a
  `load_state_dict` — is rewritten before its next use, so a stale copy is
  never read); any other weight is cast on every forward. The FP32 masters
  receive FP32 gradients through either. Layers with running statistics
  (BatchNorm) read 16-bit activations with FP32 parameters and statistics.
  Outputs stay at the precision they were computed in, as in the plan: no
  cast back to FP32 after each operator;
- a precision-dependent operator (elementwise, pooling, dropout: the plan's
  nodes with `planned: false`) that is a leaf module (ReLU, MaxPool, ...)
  reads its inputs at its planned precision, inserting the cast the plan
  inserts where a neighbour runs wider or narrower; one called inside a
  module's own forward (a residual add, a GELU call) follows PyTorch's type
  promotion, the widest of its inputs — the rule QSync plans it by; a leaf
  with weights that no node names (the exporter attributed its operator to
  a neighbour: dynamo names a Conv after the BatchNorm it feeds) runs at the
  precision of its weights' refreshed copies if the plan keeps any, else
  reads its weights at its input's dtype;
- an operator called inside a module's own forward (attention's matmuls and
  softmax, a functional conv) is intercepted with a TorchFunctionMode active
  only in that module's forward, matched by kind and order of call, and
  reads its inputs at its precision (FP32 included);
- INT8 runs as quantize-dequantize in FP32 (symmetric, per tensor for
  activations and per output channel for weights, scales from the tensors'
  current ranges, straight-through gradients in FP32) — QSync's own
  simulation mode — except for Linear layers on CUDA, which use PyTorch's
  int8 GEMM (`torch._int_mm`) where the shapes allow; FP8 likewise by an
  E4M3 round trip with a per-tensor scale;
- the model's own outputs are FP32, as the planned graph's outputs are.

A plan applied to a model it was not made for is an error: when planned
operators name modules the model does not have, `apply_plan` raises
`PlanError` naming the first such module and how many there are (the
manifest's `model` names the model the plan was made for), unless
`partial=True`. Operators the plan cannot tie to a module are listed in the
report, never dropped silently.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._manifest import Plan
from .errors import PlanError

DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
# Widest first: where several planned nodes share one call or module, the
# widest precision among them is the one applied.
ORDER = ["fp32", "tf32", "bf16", "fp16", "fp8e5m2", "fp8e4m3", "fp8", "int8"]


def _widest(ps):
    return min(ps, key=lambda p: ORDER.index(p) if p in ORDER else 0)


# ---- precision arithmetic ---------------------------------------------------


def _fake_int8(x, dim=None):
    """Symmetric int8 quantize-dequantize with straight-through gradients."""
    a = x.detach().abs()
    amax = a.amax() if dim is None else a.amax(dim=tuple(d for d in range(x.dim()) if d != dim), keepdim=True)
    scale = (amax / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.clamp(torch.round(x.detach() / scale), -127, 127) * scale
    return x + (q - x).detach()


def _fake_fp8(x):
    amax = x.detach().abs().amax()
    scale = (amax / 448.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = (x.detach() / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale
    return x + (q - x).detach()


def compute_dtype(p):
    """The dtype an operator planned at precision `p` reads and computes
    in: the 16-bit floats as themselves; FP32, TF32 and the simulated INT8
    and FP8 (quantize-dequantize) in FP32."""
    return DTYPES.get(p, torch.float32)


def _lower(p, t, weight=False):
    """`t` as precision `p` computes with it (floating tensors only; lists
    and tuples element by element)."""
    if isinstance(t, (list, tuple)):
        return type(t)(_lower(p, x, weight) for x in t)
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
        return t
    if p in DTYPES:
        return t.to(DTYPES[p])
    t = t.float()
    if p == "int8":
        return _fake_int8(t, dim=0 if weight and t.dim() > 1 else None)
    if p.startswith("fp8"):
        return _fake_fp8(t)
    return t


def _as(dtype, t):
    """Floating tensors of `t` (a tensor, list or tuple) as `dtype`."""
    if isinstance(t, (list, tuple)):
        return type(t)(_as(dtype, x) for x in t)
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
        return t.to(dtype)
    return t


def _to_f32(out):
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return type(out)(*(_to_f32(o) for o in out))
    if isinstance(out, (tuple, list)):
        return type(out)(_to_f32(o) for o in out)
    if isinstance(out, dict):
        # In place: Hugging Face's ModelOutput keeps attributes and keys in step.
        for k in list(out.keys()):
            out[k] = _to_f32(out[k])
        return out
    return out


class _UseCopy(torch.autograd.Function):
    """Reads a refreshed copy in place of its master: forward returns the
    stored low-precision copy, backward hands the gradient to the FP32
    master in FP32 (what a cast's backward does)."""

    @staticmethod
    def forward(ctx, master, copy):
        ctx.dtype = master.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype), None


class RefreshedCopy:
    """A low-precision copy of one FP32 master parameter, held between
    optimizer steps (the plan's `refreshed_copies` entry `copy`)."""

    def __init__(self, name, copy_name, master, dtype):
        self.name = name  # the parameter's path in the module
        self.copy_name = copy_name  # the copy's name in the plan
        self.master = master
        self.dtype = dtype
        self.tensor = None
        self._version = None
        self.refreshes = 0

    def refresh(self):
        """Rewrites the copy from its master (in place where it can)."""
        m = self.master
        with torch.no_grad():
            if self.tensor is None or self.tensor.device != m.device or self.tensor.shape != m.shape:
                self.tensor = m.detach().to(self.dtype)
            else:
                self.tensor.copy_(m.detach())
        self._version = m._version
        self.refreshes += 1

    def stale(self):
        m = self.master
        return self.tensor is None or self._version != m._version or self.tensor.device != m.device

    def read(self):
        """The copy as an operator reads it (gradients reach the master)."""
        if self.stale():
            self.refresh()
        return _UseCopy.apply(self.master, self.tensor)


class _Int8Linear(torch.autograd.Function):
    """y = x Wᵀ + b through torch._int_mm (CUDA), gradients by the
    dequantized operands (straight through)."""

    @staticmethod
    def forward(ctx, x, w, b):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        sx = (x2.abs().amax() / 127.0).clamp_min(1e-30)
        sw = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-30)
        xq = torch.clamp(torch.round(x2 / sx), -127, 127).to(torch.int8)
        wq = torch.clamp(torch.round(w / sw[:, None]), -127, 127).to(torch.int8)
        acc = torch._int_mm(xq, wq.t().contiguous())
        y = acc.float() * sx * sw[None, :]
        if b is not None:
            y = y + b
        ctx.save_for_backward(xq.float() * sx, wq.float() * sw[:, None])
        ctx.has_bias = b is not None
        ctx.shape = shape
        return y.reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xd, wd = ctx.saved_tensors
        g2 = gy.reshape(-1, gy.shape[-1]).float()
        gx = (g2 @ wd).reshape(ctx.shape)
        gw = g2.t() @ xd
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb


def _int_mm_ok(x, w):
    m = x.numel() // x.shape[-1]
    return x.is_cuda and m > 16 and x.shape[-1] % 8 == 0 and w.shape[0] % 8 == 0 and hasattr(torch, "_int_mm")


# ---- applying ----------------------------------------------------------------


@dataclass
class ApplyReport:
    """What `apply_plan` did: planned nodes mapped to modules (with the
    precision applied), those it could not map (with why), counts."""

    device: str
    mapped: list = field(default_factory=list)  # (node, module path, precision)
    unmapped: list = field(default_factory=list)  # (node, reason)
    per_precision: Counter = field(default_factory=Counter)
    warnings: list = field(default_factory=list)
    # Layers with running statistics (BatchNorm) planned in 16 bits: they
    # read 16-bit activations, their parameters and statistics stay FP32.
    kept_fp32: list = field(default_factory=list)
    # Precision-dependent operators set through their leaf module
    # (node, module path, precision).
    dependent: list = field(default_factory=list)
    # Leaves no planned node names but whose weights have 16-bit refreshed
    # copies, run at that precision: (module path, precision).
    implied: list = field(default_factory=list)
    # Leaves with weights no plan node names, run at their input's dtype.
    followed: list = field(default_factory=list)
    # The plan's refreshed copies held for this model's parameters.
    copies: list = field(default_factory=list)  # RefreshedCopy
    # Refreshed copies of the plan with no parameter here (cast per forward).
    unmapped_copies: list = field(default_factory=list)  # (copy, why)
    _records: list = field(default_factory=list, repr=False)

    def refresh(self):
        """Rewrites every refreshed copy from its FP32 master: call it after
        each `optimizer.step()` (or let `attach` do it)."""
        for c in self.copies:
            c.refresh()

    def attach(self, optimizer):
        """Registers `refresh` as `optimizer`'s step post-hook, so the
        copies are rewritten after every step. Returns the hook's handle."""
        return optimizer.register_step_post_hook(lambda _opt, _args, _kwargs: self.refresh())

    def unmatched_calls(self):
        """After a forward pass: planned calls no forward has reached, as
        `(module, call)` (they ran at FP32). Empty when everything matched."""
        out = []
        for r in self._records:
            out.extend(r.unreached())
        return out

    def summary(self):
        hist = ", ".join(f"{k} {v}" for k, v in sorted(self.per_precision.items()))
        return (f"qsync plan for {self.device}: {len(self.mapped)} planned operators mapped ({hist}), "
                f"{len(self.unmapped)} unmapped")

    def __str__(self):
        lines = [self.summary()]
        lines += [f"  unmapped {n}: {why}" for n, why in self.unmapped]
        lines += [f"  refreshed copy {n} not held: {why}" for n, why in self.unmapped_copies]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


_ACTIVE = threading.local()


def _stack():
    s = getattr(_ACTIVE, "stack", None)
    if s is None:
        s = _ACTIVE.stack = []
    return s


def _family_of_plan(op, call):
    if call and call.startswith("scaled_dot_product_attention"):
        return "attention"
    return {
        "MatMul": "matmul", "Gemm": "matmul", "Einsum": "matmul", "MatMulInteger": "matmul",
        "Conv": "conv", "ConvTranspose": "conv",
        "Softmax": "softmax", "LogSoftmax": "softmax",
        "LayerNormalization": "norm", "BatchNormalization": "norm", "GroupNormalization": "norm",
        "InstanceNormalization": "norm", "Attention": "attention",
        "ReduceMean": "reduce", "ReduceSum": "reduce", "ReduceMax": "reduce", "ReduceMin": "reduce",
        "ReduceProd": "reduce", "ReduceL1": "reduce", "ReduceL2": "reduce", "ReduceSumSquare": "reduce",
        "ReduceLogSumExp": "reduce", "ReduceLogSum": "reduce",
        "GlobalAveragePool": "pool", "AveragePool": "pool", "GlobalMaxPool": "pool", "MaxPool": "pool",
    }.get(op, op.lower())


def _torch_families():
    fam = {}
    for f in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm, torch.mm,
              torch.Tensor.mm, torch.baddbmm, torch.addmm, torch.einsum, F.linear):
        fam[f] = "matmul"
    for f in (F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d):
        fam[f] = "conv"
    for f in (F.softmax, torch.softmax, torch.Tensor.softmax, F.log_softmax, torch.log_softmax):
        fam[f] = "softmax"
    for f in (F.layer_norm, F.batch_norm, F.group_norm, F.instance_norm):
        fam[f] = "norm"
    for f in (torch.mean, torch.Tensor.mean, torch.sum, torch.Tensor.sum, torch.amax, torch.Tensor.amax,
              torch.logsumexp, torch.Tensor.logsumexp, torch.norm, torch.Tensor.norm):
        fam[f] = "reduce"
    for f in (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d, F.avg_pool1d, F.avg_pool2d,
              F.avg_pool3d, F.adaptive_max_pool2d, F.max_pool2d):
        fam[f] = "pool"
    fam[F.scaled_dot_product_attention] = "attention"
    return fam


_FAMILIES = _torch_families()


class _CallRecord(TorchFunctionMode):
    """Per-call precisions inside one module's own forward."""

    def __init__(self, path, calls):
        super().__init__()
        self.path = path
        # family -> [(call, precision)] in plan order
        self.calls = {}
        for fam, call, p in calls:
            self.calls.setdefault(fam, []).append((call, p))
        self.count = Counter()
        self.reached = set()

    def unreached(self):
        return [(self.path, c) for fam, cs in self.calls.items() for c, _ in cs if (fam, c) not in self.reached]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fam = _FAMILIES.get(func)
        st = _stack()
        if fam is None or not st or st[-1] is not self or fam not in self.calls:
            return func(*args, **kwargs)
        i = self.count[fam]
        self.count[fam] += 1
        planned = self.calls[fam]
        if i >= len(planned):
            return func(*args, **kwargs)
        call, p = planned[i]
        self.reached.add((fam, call))
        # Inputs at the planned precision (FP32 too: a 16-bit producer's
        # output is cast up, as the plan does); the output stays as computed.
        args = tuple(_lower(p, a) for a in args)
        kwargs = {k: _lower(p, v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _install_calls(owners):
    """Hooks that keep, per thread, a stack of the module forwards running:
    each owner's record while its own code runs, `None` while any other
    module under an owner runs (its calls are its own). One pre and one post
    hook per module, whatever nesting of owners."""
    under = {}
    for m, rec in owners.items():
        for sub in m.modules():
            under.setdefault(id(sub), (sub, owners.get(sub)))

    for sub, rec in under.values():

        def pre(_m, _a, rec=rec):
            _stack().append(rec)
            if rec is not None:
                rec.count.clear()
                rec.__enter__()

        def post(_m, _a, _o, rec=rec):
            st = _stack()
            if st:
                st.pop()
            if rec is not None:
                rec.__exit__(None, None, None)

        sub.register_forward_pre_hook(pre)
        sub.register_forward_hook(post, always_call=True)


def _wrap_dependent(module, p):
    """A precision-dependent leaf (ReLU, pooling, dropout): its inputs at
    the planned precision, nothing else changed."""
    orig = module.forward
    dt = compute_dtype(p)

    def forward(*args, **kwargs):
        return orig(*_as(dt, args), **{k: _as(dt, v) for k, v in kwargs.items()})

    module.forward = forward


def _wrap_follow(module):
    """A leaf with weights that no plan node names and no refreshed copy
    covers (the exporter attributed its operator to a neighbour): its
    weights are read at its input's dtype."""
    orig = module.forward
    params = dict(module.named_parameters(recurse=False))

    def forward(*args, **kwargs):
        x = next((t for t in args if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if x is None or all(v.dtype == x.dtype for v in params.values()):
            return orig(*args, **kwargs)
        return _call_with(module, orig, {k: _as(x.dtype, v) for k, v in params.items()}, args, kwargs)

    module.forward = forward


def _wrap_leaf(module, p, report, path, copies):
    """A planned leaf module at precision `p`. `copies`: parameter name ->
    RefreshedCopy for the weights the plan keeps as refreshed copies."""
    orig = module.forward
    params = dict(module.named_parameters(recurse=False))

    if p in ("fp32", "tf32") or p not in DTYPES and not (p == "int8" or p.startswith("fp8")):

        def forward(*args, **kwargs):
            return orig(*_as(torch.float32, args), **{k: _as(torch.float32, v) for k, v in kwargs.items()})

        module.forward = forward
        return
    if p == "int8" and isinstance(module, torch.nn.Linear):

        def forward(x, *a, **kw):
            x = x.float()
            if _int_mm_ok(x, module.weight):
                return _Int8Linear.apply(x, module.weight, module.bias)
            return F.linear(_fake_int8(x), _fake_int8(module.weight, dim=0), module.bias)

        module.forward = forward
        return

    if p in DTYPES and any(b.is_floating_point() for b in module.buffers(recurse=False)):
        # Running statistics update in place in their own dtype: such a layer
        # (BatchNorm) reads 16-bit activations with FP32 parameters and
        # statistics (PyTorch's mixed-precision batch norm) and writes 16 bits.
        dt = DTYPES[p]
        report.kept_fp32.append(f"{path} ({type(module).__name__}, planned {p}: FP32 parameters)")

        def forward(*args, **kwargs):
            return orig(*_as(dt, args), **{k: _as(dt, v) for k, v in kwargs.items()})

        module.forward = forward
        return

    def forward(*args, **kwargs):
        cast = {k: (copies[k].read() if k in copies else _lower(p, v, weight=True)) for k, v in params.items()}
        args = tuple(_lower(p, a) for a in args)
        kwargs = {k: _lower(p, v) for k, v in kwargs.items()}
        return _call_with(module, orig, cast, args, kwargs)

    module.forward = forward


def _call_with(module, orig, cast, args, kwargs):
    """`orig(*args)` with the module's own parameters replaced by `cast`."""
    saved = {}
    try:
        for k, v in cast.items():
            saved[k] = module._parameters[k]
            module._parameters.pop(k)
            setattr(module, k, v)
        return orig(*args, **kwargs)
    finally:
        for k, v in saved.items():
            delattr(module, k)
            module._parameters[k] = v


def _copy_readers(plan, device):
    """From the device's model.onnx (when the `onnx` package is installed):
    value name -> the nodes reading it, and initializer name -> its element
    count. None without the package or the file."""
    try:
        import onnx
    except ImportError:
        return None
    files = ((plan.manifest.get("devices") or {}).get(device) or {}).get("files") or {}
    path = plan.file(files.get("model", f"{device}/model.onnx"))
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 -- absent or unreadable: fall back to names
        return None
    readers = {}
    for n in m.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)
    numel = {}
    for t in m.graph.initializer:
        k = 1
        for d in t.dims:
            k *= int(d)
        numel[t.name] = k
    return readers, numel


# Nodes that carry no precision of their own (shape arithmetic, constants).
_NO_PRECISION = {"Constant", "ConstantOfShape", "Shape", "Size", "Range"}
_COPY_DTYPES = {"f16": torch.float16, "fp16": torch.float16, "bf16": torch.bfloat16}


def _model_name(plan):
    m = plan.manifest.get("model") or {}
    name = m.get("name") or m.get("path") or "?"
    h = m.get("sha256")
    return f"`{name}`" + (f" (sha256 {h[:12]}…)" if h else "")


def apply_plan(module, plan_dir, device_type, *, prefix=None, partial=False, optimizer=None):
    """Makes `module` compute as `plan_dir`'s plan for `device_type` says.

    `prefix`: the module path of `module` inside the exported model (e.g.
    `"m"` when the export wrapped it as `Wrap(m=module)`); by default the
    prefix that maps the most planned operators is chosen (none, or the
    export's first one or two path components).

    Raises `PlanError` when planned operators name modules `module` does
    not have (the plan was made for another model), naming the first and
    how many; `partial=True` applies the operators that map and lists the
    others in the report instead.

    `optimizer`: the refreshed copies are rewritten after each of its steps
    (`report.attach(optimizer)`); without it, call `report.refresh()` after
    each `optimizer.step()` (a copy whose master changed is rewritten
    before its next use either way). Returns an `ApplyReport`.
    """
    plan = Plan.load(plan_dir)
    dplan = plan.device_plan(device_type)
    report = ApplyReport(device=device_type)
    names = {n for n, _ in module.named_modules()}
    nodes_all = dplan.get("nodes", [])
    planned = [n for n in nodes_all if n.get("planned")]

    def fit(path, pre):
        if path is None:
            return None
        if pre is None:
            return path if path in names else None
        if path == pre:
            return ""
        if pre and path.startswith(pre + "."):
            q = path[len(pre) + 1:]
            return q if q in names else None
        return None

    if prefix is None:
        best = (-1, None)
        mods = [n.get("module") for n in planned if n.get("module") is not None]
        cands = {None} | {".".join(m.split(".")[:k]) for m in mods for k in (1, 2) if m and len(m.split(".")) >= k}
        for pre in sorted(cands, key=lambda c: (c is not None, c or "")):
            hits = sum(1 for m in mods if fit(m, pre) is not None)
            if hits > best[0]:
                best = (hits, pre)
        prefix = best[1]

    by_module = {}
    missing = []
    for n in planned:
        name, p, path = n["name"], n["precision"], n.get("module")
        if path is None:
            report.unmapped.append((name, "the exporter recorded no module for this operator"))
            continue
        target = fit(path, prefix)
        if target is None:
            missing.append((name, path))
            report.unmapped.append((name, f"module `{path}` is not in this model"
                                          + (f" (prefix `{prefix}` stripped)" if prefix else "")))
            continue
        by_module.setdefault(target, []).append(n)

    if missing and not partial:
        node, path = missing[0]
        raise PlanError(
            f"{plan.path}: the plan for {device_type} was made for model {_model_name(plan)}, not this "
            f"{type(module).__name__}: {len(missing)} of its {len(planned)} planned operators name modules "
            f"this model does not have, the first `{path}` (operator `{node}`). Apply the plan to the model it "
            f"was made for, or pass partial=True to apply the {len(planned) - len(missing)} that map.")
    if planned and not by_module and not partial:
        raise PlanError(f"{plan.path}: none of the {len(planned)} planned operators of {device_type} maps to a "
                        f"module of this {type(module).__name__} (plan made for {_model_name(plan)}); "
                        f"pass partial=True to go on without the plan's precisions")

    all_mods = dict(module.named_modules())
    params_by_name = dict(module.named_parameters())

    # The plan's refreshed copies, by the parameter they copy: the module
    # parameters that the copy's readers in the plan's model.onnx own (the
    # exporter may have folded a transpose into the master, `val_55` for a
    # Linear weight, or merged equal initializers — the zero biases of many
    # layers — into one), else the parameter the master names.
    copies_by_param = {}
    readers = _copy_readers(plan, device_type) if dplan.get("refreshed_copies") else None
    node_module = {n["name"]: n.get("module") for n in nodes_all}
    for c in dplan.get("refreshed_copies", []):
        master, copy_name, dt = c.get("master"), c.get("copy"), _COPY_DTYPES.get(str(c.get("dtype")))
        if dt is None:
            report.unmapped_copies.append((copy_name, f"dtype {c.get('dtype')!r} is not a float copy"))
            continue
        targets = []
        if readers is not None:
            numel = readers[1].get(copy_name)
            for r in readers[0].get(copy_name, []):
                mpath = fit(node_module.get(r), prefix)
                if mpath is None or mpath not in all_mods:
                    continue
                own = [(k, v) for k, v in all_mods[mpath].named_parameters(recurse=False)
                       if numel is None or v.numel() == numel]
                pick = [k for k, _ in own if master.rsplit(".", 1)[-1] == k] or (
                    [own[0][0]] if len(own) == 1 else [])
                if pick:
                    full = f"{mpath}.{pick[0]}" if mpath else pick[0]
                    if full not in targets:
                        targets.append(full)
        if not targets:
            cands = [master] + ([master[len(prefix) + 1:]] if prefix and master.startswith(prefix + ".") else [])
            targets = [x for x in cands if x in params_by_name][:1]
        if not targets:
            report.unmapped_copies.append((copy_name, f"master `{master}` is not a parameter of this model (a value "
                                                      f"the exporter derived, e.g. a weight with a BatchNorm "
                                                      f"folded in): its reader casts per forward"))
            continue
        for t in targets:
            copies_by_param.setdefault(t, (copy_name, dt))

    def hold(m, path, p):
        """The refreshed copies of `m`'s own weights read at precision `p`."""
        held = {}
        if p in DTYPES:
            for k, _ in m.named_parameters(recurse=False):
                full = f"{path}.{k}" if path else k
                if full in copies_by_param and copies_by_param[full][1] == DTYPES[p]:
                    rc = RefreshedCopy(full, copies_by_param.pop(full)[0], params_by_name[full], DTYPES[p])
                    held[k] = rc
                    report.copies.append(rc)
        return held

    # A leaf that no planned node names but whose weight the plan keeps as a
    # 16-bit refreshed copy: the exporter attributed its operator to a
    # neighbour (dynamo names a Conv after the BatchNorm it feeds). The copy
    # says it computes in 16 bits; it runs so, reading the copy.
    implied = {}
    for full, (_copy, dt) in copies_by_param.items():
        mpath, _, _k = full.rpartition(".")
        m = all_mods.get(mpath)
        if m is not None and mpath not in by_module and not list(m.children()):
            implied.setdefault(mpath, next(k for k, v in DTYPES.items() if v == dt))
    for mpath, p in implied.items():
        _wrap_leaf(all_mods[mpath], p, report, mpath, hold(all_mods[mpath], mpath, p))
        report.implied.append((mpath, p))

    owners = {}
    for path, nodes in by_module.items():
        m = all_mods[path]
        # A module without children is one operation (Conv, Linear, norms,
        # pooling): run it whole at the precision.
        leaf = len(list(m.children())) == 0
        if leaf:
            p = _widest([n["precision"] for n in nodes])
            if len({n["precision"] for n in nodes}) > 1:
                report.warnings.append(f"`{path}`: its operators are planned at "
                                       f"{sorted({n['precision'] for n in nodes})}; the widest, {p}, is applied")
            _wrap_leaf(m, p, report, path, hold(m, path, p))
            for n in nodes:
                report.mapped.append((n["name"], path, p))
                report.per_precision[p] += 1
        else:
            calls = []
            seen = {}
            for n in nodes:
                key = (_family_of_plan(n["op"], n.get("call")), n.get("call") or n["name"])
                seen.setdefault(key, []).append(n)
            for (fam, call), ns in seen.items():
                p = _widest([x["precision"] for x in ns])
                calls.append((fam, call, p))
                for x in ns:
                    report.mapped.append((x["name"], path, p))
                    report.per_precision[p] += 1
            rec = _CallRecord(path, calls)
            owners[m] = rec
            report._records.append(rec)

    # Precision-dependent operators that are leaf modules of their own.
    dep = {}
    for n in nodes_all:
        if n.get("planned") or n.get("op") in _NO_PRECISION or n.get("module") is None:
            continue
        target = fit(n["module"], prefix)
        if target is None or target in by_module or target in implied or target not in all_mods:
            continue
        if len(list(all_mods[target].children())) == 0:
            dep.setdefault(target, []).append(n)
    for path, nodes in dep.items():
        p = _widest([n["precision"] for n in nodes])
        _wrap_dependent(all_mods[path], p)
        report.dependent.extend((n["name"], path, p) for n in nodes)

    for path, m in all_mods.items():
        if path in by_module or path in dep or path in implied or list(m.children()):
            continue
        if any(v.is_floating_point() for v in m.parameters(recurse=False)) and not any(
                b.is_floating_point() for b in m.buffers(recurse=False)):
            _wrap_follow(m)
            report.followed.append(path)

    for full, (copy_name, _dt) in copies_by_param.items():
        report.unmapped_copies.append((copy_name, f"`{full}` is not read by a 16-bit leaf module here; "
                                                  f"cast on every forward instead"))
    for c in report.copies:
        c.refresh()
    _install_calls(owners)
    # The planned graph's outputs are FP32.
    module.register_forward_hook(lambda _m, _a, out: _to_f32(out))
    if optimizer is not None:
        report.attach(optimizer)
    if any(p == "int8" for _, _, p in report.mapped) and not torch.cuda.is_available():
        report.warnings.append("INT8 runs as quantize-dequantize in FP32 on CPU (QSync's simulation mode)")
    for w in report.warnings:
        warnings.warn(w, stacklevel=2)
    return report
