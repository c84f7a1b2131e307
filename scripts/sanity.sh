#!/usr/bin/env bash
# Predicted single-GPU training throughput next to published NVIDIA figures
# (docs/results.md, "Sanity against the real world"). One command reproduces the
# table: `bash scripts/sanity.sh` (set QSYNCC to use another binary).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=../shared/models
if [ -z "${QSYNCC:-}" ]; then
  cargo build -q -p qsyncc --features full
  QSYNCC=target/debug/qsyncc
fi

# model | file | device | precision | batch | optimizer | extra | published | source
ROWS=(
  "ResNet-50|resnet50_train.onnx|v100|fp32|112|momentum||367|DLE PyTorch RN50 v1.5, DGX-1 16GB, 1 GPU FP32 (bs 112)"
  "ResNet-50|resnet50_train.onnx|v100|fp16|256|momentum||1200|DLE PyTorch RN50 v1.5, DGX-1 16GB, 1 GPU AMP (bs 256)"
  "ResNet-50|resnet50_train.onnx|t4|fp32|128|momentum||-|none found"
  "ResNet-50|resnet50_train.onnx|t4|fp16|256|momentum||-|none found"
  "BERT-base s128|bert_base_train.onnx|v100|fp32|32|adam|--dim seq=128|-|none found"
  "BERT-base s128|bert_base_train.onnx|v100|fp16|32|adam|--dim seq=128|-|none found"
  "BERT-base s128|bert_base_train.onnx|t4|fp32|32|adam|--dim seq=128|-|none found"
  "BERT-base s128|bert_base_train.onnx|t4|fp16|32|adam|--dim seq=128|-|none found"
)

printf '| model | GPU | precision | batch | predicted samples/s | published samples/s | ratio | source |\n'
printf '|---|---|---|---:|---:|---:|---:|---|\n'
for row in "${ROWS[@]}"; do
  IFS='|' read -r name file dev prec batch opt extra published source <<<"$row"
  # shellcheck disable=SC2086
  json=$("$QSYNCC" simulate "$MODELS/$file" --targets "$dev" --batch "$batch" \
    --precision "$dev=$prec" --optimizer "$opt" $extra --json)
  predicted=$(python3 -c 'import json,sys; print(round(json.load(sys.stdin)["samples_per_s"]))' <<<"$json")
  if [ "$published" = "-" ]; then
    ratio="-"
  else
    ratio=$(python3 -c "print(f'{$predicted / $published:.2f}')")
  fi
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$dev" "$prec" "$batch" "$predicted" "$published" "$ratio" "$source"
done
