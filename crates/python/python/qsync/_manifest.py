"""Reading a qsync plan directory: `qsync.Plan`.

A plan directory (`qsyncc MODEL --targets ... -o plan/`) holds
`manifest.json` (the cluster, each device type's local batch and gradient
weight, the synchronization scheme) and `<device>/plan.json` (every operator
with its precision and, when the exporter recorded it, the PyTorch module and
call it came from). Reading one needs no PyTorch: `qsync.plan` returns a
`Plan`; `apply_plan` (plan.py, PyTorch) reads one to apply it.
"""

from __future__ import annotations

import json
import os

from .errors import PlanError


def _read_json(path):
    """A JSON file as a Python value; PlanError naming the file for anything
    that is not one (missing, not UTF-8, not JSON, nested too deep)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlanError(f"{path}: not a readable JSON file ({type(e).__name__}: {str(e)[:200]})") from None


def _is_int(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _check_manifest(mpath, m):
    """The parts of a manifest this package reads, with the types and
    ranges qsyncc writes; PlanError naming the manifest and the field."""
    def bad(what):
        raise PlanError(f"{mpath}: {what}")

    if not isinstance(m, dict):
        bad(f"a manifest is a JSON object, not {type(m).__name__}")
    targets = m.get("targets")
    if not isinstance(targets, list) or not targets:
        bad("no targets")
    if len(targets) > 4096:
        bad(f"{len(targets)} targets (at most 4096)")
    seen = set()
    for i, t in enumerate(targets):
        at = f"targets[{i}]"
        if not isinstance(t, dict):
            bad(f"{at} is not an object")
        d = t.get("device")
        if not isinstance(d, str) or not d or len(d) > 256:
            bad(f"{at}.device is not a device name")
        if d in seen:
            bad(f"{at}.device {d!r} is listed twice")
        seen.add(d)
        if not _is_int(t.get("count"), 1, 1 << 20):
            bad(f"{at}.count is not a device count (1 to 2^20)")
        if t.get("per_node") is not None and not _is_int(t.get("per_node"), 1, 1 << 16):
            bad(f"{at}.per_node is not a number of devices per node")
        if not _is_int(t.get("local_batch"), 0, 1 << 30):
            bad(f"{at}.local_batch is not a batch size")
        w = t.get("gradient_weight")
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 <= w < float("inf"):
            bad(f"{at}.gradient_weight is not a finite weight")
    for key in ("devices", "cluster", "sync"):
        if m.get(key) is not None and not isinstance(m[key], dict):
            bad(f"{key} is not an object")
    for d, entry in (m.get("devices") or {}).items():
        if not isinstance(entry, dict):
            bad(f"devices.{d} is not an object")
        files = entry.get("files", {})
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            bad(f"devices.{d}.files is not an object of file names")
    model = m.get("model")
    if model is not None and not (isinstance(model, dict)
                                  and all(model.get(k) is None or isinstance(model.get(k), str)
                                          for k in ("name", "sha256"))):
        bad("model is not an object with a name and a sha256")
    cluster, sync = m.get("cluster") or {}, m.get("sync") or {}
    if "global_batch" in cluster and not _is_int(cluster["global_batch"], 0, 1 << 40):
        bad("cluster.global_batch is not a batch size")
    if "scheme" in sync and not isinstance(sync["scheme"], str):
        bad("sync.scheme is not a scheme name")
    if "group" in sync and not _is_int(sync["group"], 1, 1 << 30):
        bad("sync.group is not a group size")


class Plan:
    """A plan directory's manifest, with per-device plans on demand."""

    def __init__(self, path, manifest):
        self.path = os.fspath(path)
        _check_manifest(os.path.join(self.path, "manifest.json"), manifest)
        self.manifest = manifest
        self.targets = manifest["targets"]
        # Set by `qsync.plan`: what `qsyncc plan --json` prints, the notes
        # on aliases taken, the planner's warnings.
        self.summary = None
        self.notes = []
        self.warnings = []
        self._models = {}

    @classmethod
    def load(cls, path):
        mpath = os.path.join(os.fspath(path), "manifest.json")
        try:
            manifest = _read_json(mpath)
        except FileNotFoundError:
            raise PlanError(f"{mpath}: no manifest (is {path} a plan directory written by qsyncc?)") from None
        if not isinstance(manifest, dict):
            raise PlanError(f"{mpath}: a manifest is a JSON object, not {type(manifest).__name__}")
        schema = manifest.get("schema", "")
        if not str(schema).startswith("qsync-plan/"):
            raise PlanError(f"{mpath}: schema {schema!r} is not a qsync plan")
        return cls(path, manifest)

    @property
    def model_name(self):
        """The name of the model the plan was made for (the manifest's
        `model.name`: the planned file's stem), None if not recorded."""
        return (self.manifest.get("model") or {}).get("name")

    @property
    def model_sha256(self):
        """The SHA-256 of the model file the plan was made from."""
        return (self.manifest.get("model") or {}).get("sha256")

    @property
    def device_count(self):
        return sum(int(t["count"]) for t in self.targets)

    @property
    def devices(self):
        return [t["device"] for t in self.targets]

    def cluster_text(self):
        return ",".join(f"{t['device']}:{t['count']}" for t in self.targets)

    def _target(self, device):
        for t in self.targets:
            if t["device"] == device:
                return t
        raise PlanError(f"{self.path}: no device type {device!r} in the plan (it has {', '.join(self.devices)})")

    def device_for_rank(self, rank):
        """Rank order follows the manifest's targets: the first type's ranks first."""
        at = 0
        for t in self.targets:
            at += int(t["count"])
            if rank < at:
                return t["device"]
        raise PlanError(f"{self.path}: rank {rank} is beyond the plan's {self.device_count} devices")

    def local_batch(self, device):
        return int(self._target(device)["local_batch"])

    def gradient_weight(self, device):
        return float(self._target(device)["gradient_weight"])

    @property
    def global_batch(self):
        return int((self.manifest.get("cluster") or {}).get("global_batch", 0))

    @property
    def sync_scheme(self):
        return (self.manifest.get("sync") or {}).get("scheme", "fp32")

    @property
    def sync_group(self):
        return int((self.manifest.get("sync") or {}).get("group", 512))

    @property
    def nodes(self):
        n = 0
        for t in self.targets:
            per = int(t.get("per_node") or t["count"])
            n += -(-int(t["count"]) // max(per, 1))
        return max(n, 1)

    def file(self, rel):
        """The path of `rel`, a file the manifest names, inside the plan
        directory. A plan names its files relative to its own folder: an
        absolute path, a `..` component or a symbolic link that leads out of
        the folder is refused (PlanError naming the manifest and the path),
        so a plan directory cannot make this package read other files."""
        mpath = os.path.join(self.path, "manifest.json")
        if not isinstance(rel, str) or not rel or "\0" in rel:
            raise PlanError(f"{mpath}: file name {rel!r} is not a relative path")
        parts = rel.replace("\\", "/").split("/")
        if os.path.isabs(rel) or any(c in ("", ".", "..") for c in parts):
            raise PlanError(f"{mpath}: file {rel!r} is not a plain relative path inside the plan directory")
        root = os.path.realpath(self.path)
        full = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([root, full]) != root:
            raise PlanError(f"{mpath}: file {rel!r} leads out of the plan directory (to {full})")
        return full

    def device_plan(self, device):
        self._target(device)
        files = ((self.manifest.get("devices") or {}).get(device) or {}).get("files") or {}
        rel = files.get("plan", f"{device}/plan.json")
        p = self.file(rel)
        try:
            d = _read_json(p)
        except FileNotFoundError as e:
            raise PlanError(f"{p}: {e}") from None
        if not isinstance(d, dict):
            raise PlanError(f"{p}: a device plan is a JSON object, not {type(d).__name__}")
        return d

    def onnx_model(self, device):
        """The device type's planned model (`<device>/model.onnx`: casts and
        QDQ materialized, at its local batch) as an `onnx.ModelProto`
        (needs the onnx package)."""
        from .compiler import require_onnx

        self._target(device)
        if device not in self._models:
            files = ((self.manifest.get("devices") or {}).get(device) or {}).get("files") or {}
            self._models[device] = require_onnx().load(self.file(files.get("model", f"{device}/model.onnx")))
        return self._models[device]

    @property
    def models(self):
        """Every device type's planned model: {device: onnx.ModelProto}."""
        return {d: self.onnx_model(d) for d in self.devices}
