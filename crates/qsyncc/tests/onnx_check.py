#!/usr/bin/env python3
"""Check written ONNX files with onnx.checker.check_model(full_check=True).

Usage: onnx_check.py FILE.onnx...

A file's external data may be absent (models shipped without weights, and
the low-precision copies qsync writes of such weights, which reference a file
that is not written). The checker insists that a referenced file exists, so
for those the check runs on a copy in a temporary directory beside sparse
zero-filled stand-ins of the referenced size: the structure, the types, shape
inference and that every initializer holds or references its values are all
checked; only the absent values are not. An initializer that neither holds
nor references values is reported by name before the checker runs.

Prints one line per failing file and exits 1 if any failed.
"""
import os
import shutil
import sys
import tempfile

import onnx
from onnx import helper

VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def external_needs(model):
    """{location: bytes needed} for every external initializer."""
    need = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        kv = {e.key: e.value for e in t.external_data}
        n = 1
        for d in t.dims:
            n *= d
        bits = 4 if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) else None
        size = (n * bits + 7) // 8 if bits else n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        end = int(kv.get("offset", 0)) + int(kv.get("length", size))
        loc = kv["location"]
        need[loc] = max(need.get(loc, 0), end)
    return need


def valueless(model):
    """Initializers with elements that neither hold nor reference values."""
    out = []
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n == 0 or t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if not any(len(getattr(t, f)) for f in VALUE_FIELDS):
            out.append(t.name)
    return out


def check(path):
    model = onnx.load(path, load_external_data=False)
    empty = valueless(model)
    if empty:
        raise ValueError(f"{len(empty)} initializers without values: {', '.join(empty[:5])}")
    base = os.path.dirname(os.path.abspath(path))
    needs = external_needs(model)
    if all(os.path.isfile(os.path.join(base, loc)) for loc in needs):
        onnx.checker.check_model(path, full_check=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        for loc, size in needs.items():
            p = os.path.join(tmp, loc)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.truncate(size)
        onnx.checker.check_model(copy, full_check=True)


def main():
    failed = 0
    for path in sys.argv[1:]:
        try:
            check(path)
        except Exception as e:  # the checker raises several types
            failed += 1
            print(f"{path}: {type(e).__name__}: {str(e).strip().splitlines()[0]}")
    print(f"checked {len(sys.argv) - 1} files, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
