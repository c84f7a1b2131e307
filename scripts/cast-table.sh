#!/usr/bin/env bash
# The issue-5 cast table on every shared model (printed as Markdown).
# Installs onnxconverter-common with pip, converts each model with
# convert_float_to_float16(keep_io_types=True) twice — keeping in FP32 the
# op types amp keeps in FP32, and keeping a fixed AMP-like op list — and
# counts the Cast nodes it adds (its weights are converted offline, so
# these are all activation casts).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip install -q onnxconverter-common >/dev/null 2>&1 || python3 -m pip install -q --break-system-packages onnxconverter-common >/dev/null
cargo run -q --release -p qsync-tests --example cast_table -- blocklists "$tmp/block.json"
cargo run -q --release -p qsync-tests --example cast_table -- amp-like "$tmp/fixed.json"
python3 - "$tmp/block.json" "$tmp/fixed.json" "$tmp/conv.json" "$tmp/conv_fixed.json" <<'PY'
import json, sys, os
import onnx
from onnxconverter_common import float16
block = json.load(open(sys.argv[1]))
fixed = json.load(open(sys.argv[2]))
models = os.path.join(os.path.dirname(os.path.abspath(".")), "shared", "models")
for lists, out_path in ((block, sys.argv[3]), ({name: fixed for name in block}, sys.argv[4])):
    out = {}
    for name, ops in sorted(lists.items()):
        m = onnx.load(os.path.join(models, name), load_external_data=False)
        before = sum(n.op_type == "Cast" for n in m.graph.node)
        try:
            c = float16.convert_float_to_float16(m, keep_io_types=True, op_block_list=ops)
            out[name] = sum(n.op_type == "Cast" for n in c.graph.node) - before
        except Exception as e:  # noqa: BLE001
            print(f"{name}: onnxconverter-common failed: {e}", file=sys.stderr)
    json.dump(out, open(out_path, "w"))
PY
cargo run -q --release -p qsync-tests --example cast_table -- table "$tmp/conv.json" "$tmp/conv_fixed.json"
