"""qsync for PyTorch: apply a qsync plan to a module and synchronize its
gradients with qsync's quantized collectives inside DistributedDataParallel.

    plan = qsync.Plan.load("plan/")
    device = plan.device_for_rank(rank)             # or name it
    report = qsync.apply_plan(model, "plan/", device)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, qsync.comm_hook("plan/"))

The plan comes from `qsyncc MODEL --targets v100:4,t4:4 -o plan/` (the wheel
installs the `qsyncc` command) or from `qsync.plan("model.onnx",
targets="v100:4,t4:4")`, which runs the same pipeline in process and
returns the `Plan` with each device's model as an `onnx.ModelProto`;
`qsync.passes.run(model_proto, "campo,egraph-casts", target="t4")` runs
passes over an ONNX model. Each rank trains with its device type's
`plan.local_batch(device)` samples per step.
`qsync.calibrate(model, batches, "calib.json")` writes the statistics file
`qsyncc MODEL --stats calib.json` plans with.

The compiler half (`qsync.plan`, `qsync.passes`, `qsync.Plan`, the errors)
needs no PyTorch; the training half (`apply_plan`, `comm_hook`, `QSyncHook`,
`calibrate`, `TorchTransport`, `qsync.fsdp`) is imported on first use and
raises an ImportError saying so where PyTorch is missing.
"""

import importlib as _importlib
import sys as _sys
import types as _types

from ._native import SyncError, __version__, schemes
from ._manifest import Plan
from .errors import ModelError, OptionError, OutputError, PassError, PlanError, QsyncError, TargetError
from . import passes
from .compiler import plan

# The training half needs PyTorch and is imported on first use (PEP 562), so
# that the compiler (`qsync.plan`, `qsync.passes`, `qsync.Plan`, the errors,
# the `qsyncc` command) needs only the wheel and `onnx`.
_NEED_TORCH = {
    "ApplyReport": ".plan",
    "apply_plan": ".plan",
    "calibrate": "._calibrate",
    "QSyncHook": ".hook",
    "comm_hook": ".hook",
    "TorchTransport": "._transport",
    "fsdp": ".fsdp",
}


def __getattr__(name):
    where = _NEED_TORCH.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = _importlib.import_module(where, __name__)
    except ImportError as e:
        if e.name != "torch" and not (e.name or "").startswith("torch."):
            raise
        raise ImportError(
            f"qsync.{name} needs PyTorch, which cannot be imported here ({e}): install it "
            f"(pip install torch, see https://pytorch.org). The compiler (qsync.plan, qsync.passes, "
            f"qsync.Plan, the qsyncc command) does not need it.",
            name=e.name,
        ) from e
    value = module if where == "." + name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NEED_TORCH))


class _Package(_types.ModuleType):
    """`qsync.plan` is the planning function: loading the submodule of the
    same name (`apply_plan`'s, on first use) must not replace it, as the
    import system does with a package's attribute named after a submodule."""

    def __setattr__(self, name, value):
        if name == "plan" and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

__all__ = [
    "ApplyReport",
    "ModelError",
    "OptionError",
    "OutputError",
    "PassError",
    "Plan",
    "PlanError",
    "QsyncError",
    "QSyncHook",
    "SyncError",
    "TargetError",
    "TorchTransport",
    "apply_plan",
    "calibrate",
    "comm_hook",
    "passes",
    "plan",
    "schemes",
    "__version__",
]
