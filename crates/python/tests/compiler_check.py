"""The compiler in the installed wheel, against the `qsyncc` binary.

    python compiler_check.py MODELS_DIR WORK_DIR

`$QSYNCC` is the binary cargo built. Checks, on SqueezeNet 1.1:
- the wheel's `qsyncc` console command prints the CLI's help and plans,
  writing the same manifest as the binary;
- `qsync.plan` (from a path, into a given or a temporary directory, and
  from an `onnx.ModelProto`) returns the manifest the binary writes for the
  same arguments, and per-device ModelProtos the ONNX checker accepts;
- `qsync.passes.run` returns the model `qsyncc opt -o` writes, checker-valid;
- without PyTorch (`import torch` refused), `import qsync`, `qsync.plan` and
  `qsync.passes.run` give the same results, and the training half
  (`apply_plan`, `comm_hook`, `calibrate`, `fsdp`, …) raises an ImportError
  naming PyTorch; with it, those load on first use;
- a bad path, bad bytes, an unknown target or pass raise the typed error
  with the message the binary prints after `error: `.
Prints one line per check; exits non-zero on the first failure.
"""

import json
import os
import subprocess
import sys
import warnings

import onnx

import qsync

warnings.simplefilter("ignore")  # the planner's warnings are checked once, below
MODELS, WORK = sys.argv[1], sys.argv[2]
MODEL = os.path.join(MODELS, "squeezenet1_1.onnx")
QSYNCC = os.environ["QSYNCC"]
CONSOLE = os.path.join(os.path.dirname(sys.executable), "qsyncc")
TARGETS = "v100:2,t4:2"


def run(exe, *args, ok=True):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        raise AssertionError(f"{exe} {args} exited {p.returncode}:\n{p.stderr}")
    return p


def cli_error(*args, sub=()):
    """The message the binary prints for a failing command, without `error: `."""
    p = run(QSYNCC, *sub, *args, ok=False)
    assert p.returncode == 2, f"qsyncc {args} exited {p.returncode}, expected 2"
    lines = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, f"qsyncc {args}: expected one error line, got:\n{p.stderr}"
    return lines[0][len("error: ") :]


def manifest(d):
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def expect(exc, fn, message):
    try:
        fn()
    except exc as e:
        assert isinstance(e, qsync.QsyncError), f"{type(e).__name__} is no QsyncError"
        assert str(e) == message, f"{type(e).__name__} says\n  {e}\nthe CLI says\n  {message}"
        return type(e).__name__
    raise AssertionError(f"no {exc.__name__} raised (expected: {message})")


def check(name):
    print(f"ok  {name}", flush=True)


# ---- the console command ----------------------------------------------------
help_console = run(CONSOLE, "--help").stdout
assert help_console == run(QSYNCC, "--help").stdout, "the console command's --help differs from the binary's"
assert "Usage: qsyncc <COMMAND>" in help_console, help_console
check("qsyncc --help from the wheel is the binary's")

# The command never imports the training half: a `torch` that refuses to
# import, first on the path, does not stop it.
notorch = os.path.join(WORK, "notorch")
os.makedirs(notorch, exist_ok=True)
with open(os.path.join(notorch, "torch.py"), "w", encoding="utf-8") as f:
    f.write("raise ImportError('the qsyncc command imported torch')\n")
p = subprocess.run([CONSOLE, "--version"], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": notorch})
assert p.returncode == 0 and p.stdout.startswith("qsyncc "), p.stderr
check("the qsyncc command starts without PyTorch")

flags = [MODEL, "--targets", TARGETS, "--batch", "8"]
run(QSYNCC, *flags, "-o", os.path.join(WORK, "binary"))
run(CONSOLE, *flags, "-o", os.path.join(WORK, "console"))
want = manifest(os.path.join(WORK, "binary"))
assert manifest(os.path.join(WORK, "console")) == want, "the console command's manifest differs from the binary's"
check("qsyncc MODEL --targets … -o DIR from the wheel writes the binary's manifest")

# ---- qsync.plan -------------------------------------------------------------
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    p = qsync.plan(MODEL, targets=TARGETS, batch=8, output=os.path.join(WORK, "api"))
assert isinstance(p, qsync.Plan)
assert p.manifest == want, "qsync.plan's manifest differs from the binary's"
assert manifest(os.path.join(WORK, "api")) == want
assert p.warnings and [str(w.message) for w in caught] == [f"qsyncc: {w}" for w in p.warnings], caught
assert p.summary["chosen"] == want["chosen"] and p.summary["output"] == os.path.join(WORK, "api")
assert sorted(p.models) == sorted(want["devices"]), sorted(p.models)
for device, m in p.models.items():
    assert isinstance(m, onnx.ModelProto)
    onnx.checker.check_model(m)
    on_disk = onnx.load(os.path.join(WORK, "binary", device, "model.onnx"))
    assert m.SerializeToString() == on_disk.SerializeToString(), f"{device}: the planned model differs from the binary's"
check("qsync.plan(path) = the binary's manifest and models (checker-valid ModelProtos)")

temp = qsync.plan(MODEL, targets=TARGETS, batch=8, sync="auto", precisions=["fp32", "fp16"])
run(QSYNCC, *flags, "--sync", "auto", "--precisions", "fp32,fp16", "-o", os.path.join(WORK, "binary-auto"))
assert temp.manifest == manifest(os.path.join(WORK, "binary-auto")), "options: manifest differs"
folder = temp.path
assert os.path.isdir(folder)
del temp
assert not os.path.exists(folder), f"the temporary plan directory {folder} outlived its plan"
check("qsync.plan(…, sync=, precisions=) into a temporary directory = the binary's manifest")

proto = onnx.load(MODEL)
from_proto = qsync.plan(proto, targets=TARGETS, batch=8, name="squeezenet1_1")
planned_from = from_proto.manifest["model"]["path"]
assert planned_from.endswith("/squeezenet1_1.onnx") and planned_from != MODEL, planned_from
# The same model: the manifest differs only in the path it was read from.
assert json.dumps(from_proto.manifest).replace(planned_from, MODEL) == json.dumps(want), "ModelProto: manifest differs"
check("qsync.plan(ModelProto) plans the same model")

# ---- qsync.passes.run -------------------------------------------------------
pipeline = "campo,egraph-casts"
out = qsync.passes.run(proto, pipeline, target="t4")
onnx.checker.check_model(out)
run(QSYNCC, "opt", MODEL, "--passes", pipeline, "--target", "t4", "-o", os.path.join(WORK, "opt.onnx"))
assert out.SerializeToString() == onnx.load(os.path.join(WORK, "opt.onnx")).SerializeToString(), "passes differ"
casts = sum(n.op_type == "Cast" for n in out.graph.node)
assert casts > sum(n.op_type == "Cast" for n in proto.graph.node), "the passes added no cast"
assert "egraph-casts" in qsync.passes.available()
check(f"qsync.passes.run(ModelProto, {pipeline!r}, target='t4') = qsyncc opt -o ({casts} casts), checker-valid")

# ---- the compiler without PyTorch ----------------------------------------------
# `sys.modules["torch"] = None` makes every `import torch` raise ImportError.
NO_TORCH = """
import json, sys
sys.modules["torch"] = None
import onnx, qsync, qsync.errors
model, output, pipeline = sys.argv[1:]
p = qsync.plan(model, targets="v100:2,t4:2", batch=8, output=output)
assert isinstance(p, qsync.Plan) and sorted(p.models) == sorted(p.devices), sorted(p.models)
out = qsync.passes.run(onnx.load(model), pipeline, target="t4")
refused = {}
for name in ("apply_plan", "ApplyReport", "comm_hook", "QSyncHook", "calibrate", "TorchTransport", "fsdp"):
    try:
        getattr(qsync, name)
    except ImportError as e:
        refused[name] = str(e)
assert issubclass(qsync.errors.PlanError, qsync.QsyncError)
print(json.dumps({"manifest": p.manifest, "passes": out.SerializeToString().hex(), "refused": refused}))
"""
bare = subprocess.run([sys.executable, "-c", NO_TORCH, MODEL, os.path.join(WORK, "notorch-plan"), pipeline],
                      capture_output=True, text=True, timeout=120)
assert bare.returncode == 0, f"the compiler without PyTorch failed:\n{bare.stderr}"
r = json.loads(bare.stdout)
assert r["manifest"] == want, "qsync.plan without PyTorch: manifest differs from the binary's"
assert bytes.fromhex(r["passes"]) == out.SerializeToString(), "qsync.passes.run without PyTorch: model differs"
assert sorted(r["refused"]) == sorted(["apply_plan", "ApplyReport", "comm_hook", "QSyncHook", "calibrate",
                                        "TorchTransport", "fsdp"]), r["refused"]
for name, message in r["refused"].items():
    assert f"qsync.{name} needs PyTorch" in message and "pip install torch" in message, message
check("without PyTorch: import qsync, qsync.plan and qsync.passes.run = the binary's; "
      "qsync.apply_plan etc. raise ImportError naming PyTorch")

# With PyTorch the training half loads on first use; loading the submodule
# `qsync.plan` (apply_plan's) leaves `qsync.plan` the planning function.
from qsync.plan import apply_plan  # noqa: E402

assert qsync.apply_plan is apply_plan and callable(qsync.comm_hook) and callable(qsync.calibrate)
assert qsync.plan is qsync.compiler.plan and qsync.Plan is sys.modules["qsync.plan"].Plan
check("with PyTorch: qsync.apply_plan, comm_hook, calibrate load on first use; qsync.plan stays the function")

# ---- typed errors with the CLI's messages -------------------------------------
missing = os.path.join(WORK, "missing.onnx")
bad = os.path.join(WORK, "bad.onnx")
with open(bad, "wb") as f:
    f.write(b"\x0a\xff\xff\xff\xff\x0fnot a model")
cases = [
    (qsync.ModelError, lambda: qsync.plan(missing, targets=TARGETS), cli_error(missing, "--targets", TARGETS, "-o", os.path.join(WORK, "x"))),
    (qsync.ModelError, lambda: qsync.plan(bad, targets=TARGETS), cli_error(bad, "--targets", TARGETS, "-o", os.path.join(WORK, "x"))),
    (qsync.TargetError, lambda: qsync.plan(MODEL, targets="v99:2"), cli_error(MODEL, "--targets", "v99:2", "-o", os.path.join(WORK, "x"))),
    (qsync.OptionError, lambda: qsync.plan(MODEL, targets=TARGETS, sync="fp13"), cli_error(MODEL, "--targets", TARGETS, "--sync", "fp13", "-o", os.path.join(WORK, "x"))),
    (qsync.ModelError, lambda: qsync.passes.run(missing, "dce"), cli_error(missing, "--passes", "dce", sub=("opt",))),
    (qsync.OptionError, lambda: qsync.passes.run(proto, "no-such-pass"), cli_error(MODEL, "--passes", "no-such-pass", sub=("opt",))),
]
assert issubclass(qsync.TargetError, qsync.OptionError) and issubclass(qsync.PlanError, ValueError)
for exc, fn, message in cases:
    name = expect(exc, fn, message)
    check(f"{name}: {message[:90]}")
# `opt --target` is checked by clap: its message is "invalid value 'v99' for
# '--target <TARGET>': " and then the device table's.
clap = cli_error(MODEL, "--target", "v99", sub=("opt",))
expect(qsync.TargetError, lambda: qsync.passes.run(proto, "amp", target="v99"), clap.split("': ", 1)[1])
check("TargetError from qsync.passes.run(target='v99') names the known devices as the CLI does")
print("all compiler checks passed")
