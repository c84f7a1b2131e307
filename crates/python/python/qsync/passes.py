"""qsync's passes over ONNX models, for other ONNX pipelines:

    model = qsync.passes.run(model, "campo,egraph-casts", target="t4")

`run` is `qsyncc opt MODEL --passes PIPELINE -o OUT.onnx` in process: the
same loader, passes (verified after each one) and exporter. `available()`
names the passes a pipeline may use (see `qsyncc opt --help` for their
options).
"""

import os
import tempfile
import warnings

from . import _native
from .compiler import _model_file, require_onnx


def available():
    """The names of the passes (`infer-shapes`, …, `egraph-casts`)."""
    return list(_native.available_passes())


def run(model, passes, target=None, *, batch=None, dims=None, mode="training", stats=None, verify=True):
    """Runs the pass pipeline `passes` (`"campo,egraph-casts"`,
    `"amp(override=*Softmax*=fp32),dce"`) over `model` (an
    `onnx.ModelProto` or a path) and returns the rewritten model as an
    `onnx.ModelProto`. `target`: the device precision passes plan for (`t4`,
    `v100`, …); `batch` / `dims` bind symbolic dimensions; `mode`:
    `training` (FP32 master weights cast per use) or `inference`; `stats`:
    calibration statistics (a path). Raises `qsync.ModelError`,
    `OptionError`, `TargetError` or `PassError` with `qsyncc opt`'s message;
    the passes' warnings are issued as Python warnings."""
    onnx = require_onnx()
    dims = list((dims or {}).items())
    with tempfile.TemporaryDirectory(prefix="qsync-passes-") as folder:
        path = _model_file(model, folder)
        out = os.path.join(folder, "out.onnx")
        _, warns = _native.run_passes(
            path,
            passes,
            out,
            target=target,
            batch=batch,
            dims=dims,
            mode=mode,
            stats=os.fspath(stats) if stats is not None else None,
            verify=verify,
        )
        for w in warns:
            warnings.warn(f"qsyncc: {w}", stacklevel=2)
        return onnx.load(out)
