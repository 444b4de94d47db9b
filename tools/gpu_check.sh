#!/usr/bin/env bash
# The checks that need an accelerator, in at most 8 minutes on one GPU (issue 34):
#   1. the tests marked `gpu` (they skip themselves on CPU),
#   2. tools/gpu_check.py (python -m tools.gpu_check): transformer_base/big train-step benchmark in bfloat16 with MFU,
#      cuDNN against dense attention on packed batches (values, gradients, NaN), and 50 steps of
#      the real seq2seq-train with configs/transformer_base.yaml on a synthetic corpus.
# Figures go to $OUT (default runs/gpu_check)/gpu_check.json.
#
#   tools/gpu_check.sh          # on the GPU machine, from the repository root
#   tools/gpu_check.sh --dry    # tiny shapes on CPU (tests/test_gpu_check.py runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
if [[ "${1:-}" == "--dry" ]]; then
    # the suite already runs the gpu tests (skipped on CPU): only check that they are collected
    "$PYTHON" -m pytest -q -n 0 -m gpu --collect-only tests/test_attention.py > "$OUT/gpu_tests.txt"
    exec "$PYTHON" -m tools.gpu_check --dry --out "$OUT"
fi
tests=0
timeout 180 "$PYTHON" -m pytest -q -n 0 -m gpu tests/ 2>&1 | tee "$OUT/gpu_tests.txt" || tests=$?
check=0
timeout 330 "$PYTHON" -m tools.gpu_check --out "$OUT" "$@" || check=$?
echo "gpu tests: exit $tests; gpu_check.py: exit $check (figures in $OUT/gpu_check.json)"
exit $(( tests || check ))
