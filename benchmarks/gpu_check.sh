#!/usr/bin/env bash
# One-call GPU check of the PTD kernels: the kernel tests compiled for real on the GPU,
# then the quick benchmark. Meant for a lent device machine (docs/kernels.md):
#
#   bash benchmarks/gpu_check.sh            # from the repository root
#
# Assumes a Python with CUDA torch, triton and vLLM 0.32 (PYTHON=..., else .venv/bin/python,
# else python3); installs nothing from the network. Writes under $OUT when set (else
# ./gpu_check_out): env.txt, pytest.log, bench.log, bench.csv. Budget: about 1 min of
# tests, about 3 min of benchmark, each under its own timeout (whole run < 8 min).
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT_DIR"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
unset TRITON_INTERPRET  # the kernels must compile for the GPU here

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv 2>&1 || true
  "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'available', torch.cuda.is_available()); print('triton', triton.__version__)"
  "$PYTHON" -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to $PYTHON; nothing run" | tee -a "$OUT_DIR/env.txt"
  exit 2
fi

# vllm_ptd.kernels is kernels/ once the package is installed; a local editable install
# needs no network. If it fails, the kernel tests fall back to importing kernels/.
if ! "$PYTHON" -c "import vllm_ptd.kernels" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT_DIR/env.txt" 2>&1 \
    || echo "gpu_check: editable install failed; tests use the checkout" | tee -a "$OUT_DIR/env.txt"
fi

status=0
timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider --durations=10 \
  tests/test_kernels_tree_attention.py tests/test_kernels_kv_compaction.py \
  tests/test_kernels_tree_backend.py tests/test_kernels_bench.py \
  tests/test_tree_metadata_packing.py >"$OUT_DIR/pytest.log" 2>&1 || status=1
tail -n 25 "$OUT_DIR/pytest.log"

timeout 300 "$PYTHON" benchmarks/bench_kernels.py --quick --csv "$OUT_DIR/bench.csv" \
  >"$OUT_DIR/bench.log" 2>&1 || status=1
cat "$OUT_DIR/bench.log"

echo "gpu_check: exit status $status (0 = tests passed and every benchmark case was correct)"
exit $status
