"""qsync for PyTorch: apply a qsync plan to a module and synchronize its
gradients with qsync's quantized collectives inside DistributedDataParallel.

    plan = qsync.Plan.load("plan/")
    device = plan.device_for_rank(rank)             # or name it
    report = qsync.apply_plan(model, "plan/", device)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, qsync.comm_hook("plan/"))

The plan comes from `qsyncc MODEL --targets v100:4,t4:4 -o plan/`; each rank
trains with its device type's `plan.local_batch(device)` samples per step.
`qsync.calibrate(model, batches, "calib.json")` writes the statistics file
`qsyncc MODEL --stats calib.json` plans with.
"""

from ._native import SyncError, __version__, schemes
from ._calibrate import calibrate
from .hook import QSyncHook, comm_hook
from .plan import ApplyReport, Plan, PlanError, apply_plan
from ._transport import TorchTransport
from . import fsdp

__all__ = [
    "ApplyReport",
    "Plan",
    "PlanError",
    "QSyncHook",
    "SyncError",
    "TorchTransport",
    "apply_plan",
    "calibrate",
    "comm_hook",
    "schemes",
    "__version__",
]
