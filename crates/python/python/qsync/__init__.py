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
"""

from ._native import SyncError, __version__, schemes
from ._calibrate import calibrate
from .hook import QSyncHook, comm_hook
from .plan import ApplyReport, Plan, PlanError, apply_plan
from .errors import ModelError, OptionError, OutputError, PassError, QsyncError, TargetError
from . import passes
from .compiler import plan  # after `.plan`: `qsync.plan` is this function
from ._transport import TorchTransport
from . import fsdp

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
