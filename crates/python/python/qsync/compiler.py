"""Planning from Python: `qsync.plan` runs the `qsyncc plan` pipeline in
process (the wheel's native module holds the compiler) and returns the
plan directory as a `qsync.Plan`, with the manifest as a dict and each
device type's planned model as an `onnx.ModelProto`.

    plan = qsync.plan("model.onnx", targets="v100:4,t4:4", batch=16)
    plan.manifest["chosen"], plan.local_batch("t4")
    plan.models["t4"]                                  # onnx.ModelProto

Keyword options are `qsyncc plan`'s flags with `_` for `-` (`sync="auto"`,
`train_precision="fp16"`, `memory={"t4": "30%"}`, `dims={"seq": 128}`,
`precisions=["fp32", "fp16"]`); a failure raises the `qsync.errors` class
of its kind with the message the command prints.
"""

import json
import os
import re
import tempfile
import warnings

from . import _native
from ._manifest import Plan
from .errors import OptionError

# Flags whose Python name differs from the command's (plural: repeatable).
_FLAG_NAMES = {"dims": "dim", "profiles": "profile", "device_files": "device-file"}
# Flags that take one comma-separated list.
_COMMA_LISTS = {"precisions"}


def require_onnx():
    """The `onnx` package, or an ImportError saying how to get it."""
    try:
        import onnx
    except ImportError as e:
        raise ImportError("qsync's ONNX models need the onnx package: pip install 'qsync[onnx]'") from e
    return onnx


def _flags(options):
    out = []
    for key, value in options.items():
        name = _FLAG_NAMES.get(key, key.replace("_", "-"))
        flag = "--" + name
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, dict):
            for k, v in value.items():
                out += [flag, f"{k}={v}"]
        elif isinstance(value, (list, tuple)):
            if key in _COMMA_LISTS:
                out += [flag, ",".join(str(v) for v in value)]
            else:
                for v in value:
                    out += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
        else:
            out += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def _model_file(model, folder, name=None):
    """A path for `model`: itself if a path, else the ModelProto written
    into `folder` as `NAME.onnx` (default: its graph's name)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if not hasattr(model, "SerializeToString"):
        raise OptionError(f"a model is a path or an onnx.ModelProto, not {type(model).__name__}")
    name = name or getattr(getattr(model, "graph", None), "name", "") or ""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "model"
    path = os.path.join(folder, stem + ".onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def plan(model, targets=None, *, batch=None, output=None, name=None, **options):
    """Plans `model` (a path to an ONNX model, TorchScript archive or text
    IR, or an `onnx.ModelProto`) for `targets` (`"v100:4,t4:4"`) as
    `qsyncc plan` does, and writes the plan directory to `output` (default:
    a temporary directory removed with the returned plan). Returns a
    `qsync.Plan`: `manifest` (dict), `models` ({device: onnx.ModelProto}),
    `summary` (what `--json` prints), `path`. The planner's warnings are
    issued as Python warnings and kept in `plan.warnings`.

    A ModelProto is planned from a temporary file `NAME.onnx` (`name`:
    default its graph's name), which names the model in the manifest; one
    whose tensors are external data needs a path instead (the data is found
    beside the model file)."""
    keep = None
    if output is None:
        keep = tempfile.TemporaryDirectory(prefix="qsync-plan-")
        output = os.path.join(keep.name, "plan")
    output = os.fspath(output)
    with tempfile.TemporaryDirectory(prefix="qsync-model-") as folder:
        flags = [_model_file(model, folder, name)]
        if targets is not None:
            flags += ["--targets", str(targets)]
        if batch is not None:
            flags += ["--batch", str(batch)]
        flags += ["-o", output] + _flags(options)
        summary, notes, warns = _native.plan(flags)
    for w in warns:
        warnings.warn(f"qsyncc: {w}", stacklevel=2)
    result = Plan.load(output)
    result.summary = json.loads(summary)
    result.notes = list(notes)
    result.warnings = list(warns)
    result._temporary = keep  # the temporary directory lives as long as the plan
    return result
