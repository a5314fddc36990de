#!/usr/bin/env bash
# One-call GPU check of the PTD kernels, for the lent device machine (docs/kernels.md,
# "GPU check"): PyTorch + Triton, no vLLM, no network, the checkout copied, nothing
# installed. From the repository root:
#
#   bash benchmarks/gpu_check.sh
#
# Steps (each under its own timeout: 240 + 75 + 120 s at most; < 8 min on one H100/H200):
#   1. env.txt      GPU, driver, torch, triton, whether vLLM / vllm_ptd.kernels import
#   2. pytest.log   the kernel tests compiled for the GPU, with `import vllm` blocked
#                   (benchmarks/pytest_without_vllm.py): tree attention, KV compaction,
#                   vLLM-style K/V views, imports without vLLM, bench helpers, the
#                   end-to-end PTD check on a random Llama-style model (its counters
#                   go to the summary); vLLM-only modules skip with the reason.
#                   Also pytest.xml (JUnit).
#   3. timings.log / timings.csv   tree kernel vs SDPA (explicit mask), device vs host
#                   argmax at vocab 152k (benchmarks/gpu_timings.py): numbers only.
#   4. bench.log / bench.csv       bench_kernels.py --quick (skip: GPU_CHECK_BENCH=0).
#   5. summary.txt  one line per step; exit status 0 only if every step passed.
#
# Environment: PYTHON (default .venv/bin/python if present, else python3); OUT (logs,
# default ./gpu_check_out); GPU_CHECK_ALLOW_CPU=1 runs without a CUDA device through
# Triton's interpreter with tiny shapes (a dry run of this script; slow, and its
# timings mean nothing); GPU_CHECK_BENCH=0 skips step 4; GPU_CHECK_TEST_TIMEOUT,
# GPU_CHECK_TIMINGS_TIMEOUT, GPU_CHECK_BENCH_TIMEOUT (seconds) change the step limits.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT_DIR"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's vllm_ptd and kernels/
export PYTHONDONTWRITEBYTECODE=1
START=$(date +%s)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.memory \
    --format=csv 2>&1 || true
  "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'available', torch.cuda.is_available()); print('triton', triton.__version__)"
  timeout 60 "$PYTHON" -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  "$PYTHON" -c "import vllm_ptd.kernels as k; print('vllm_ptd.kernels from', k.__file__)" \
    2>/dev/null || echo "vllm_ptd.kernels not installed: the tests import kernels/ from the checkout"
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

MODE=gpu
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  unset TRITON_INTERPRET  # the kernels must compile for the GPU here
elif [ "${GPU_CHECK_ALLOW_CPU:-0}" = 1 ]; then
  MODE=cpu-interpreter
  export TRITON_INTERPRET=1
  echo "gpu_check: no CUDA device; GPU_CHECK_ALLOW_CPU=1: dry run through Triton's interpreter" \
    | tee -a "$OUT_DIR/env.txt"
else
  echo "gpu_check: no CUDA device visible to $PYTHON; nothing run (GPU_CHECK_ALLOW_CPU=1 for a dry run)" \
    | tee -a "$OUT_DIR/env.txt"
  exit 2
fi

TEST_FILES=(
  tests/test_kernels_tree_attention.py
  tests/test_kernels_kv_compaction.py
  tests/test_kernels_vllm_views.py
  tests/test_kernels_no_vllm.py
  tests/test_kernels_bench.py
  tests/test_kernels_tree_backend.py
  tests/test_tree_metadata_packing.py
  tests/test_gpu_end_to_end.py
)
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-240}
[ "$MODE" = gpu ] || TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-1500}
summary=()
status=0

t0=$(date +%s)
timeout "$TEST_TIMEOUT" "$PYTHON" benchmarks/pytest_without_vllm.py -q -s -rs -p no:cacheprovider \
  --durations=15 --junitxml="$OUT_DIR/pytest.xml" "${TEST_FILES[@]}" >"$OUT_DIR/pytest.log" 2>&1
rc=$?
tail -n 30 "$OUT_DIR/pytest.log"
line=$(grep -E "^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s" \
  "$OUT_DIR/pytest.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
[ "$rc" = 124 ] && line="timed out after ${TEST_TIMEOUT}s; $line"
if [ "$rc" = 0 ]; then res=PASS; else res=FAIL; status=1; fi
summary+=("tests    $res  ${line:-no pytest summary line (see pytest.log)} [$(( $(date +%s) - t0 ))s]")
while IFS= read -r e2e; do summary+=("  e2e    $e2e"); done \
  < <(grep -E "^(LBNHC|BLNHC|batch): [0-9]+ steps" "$OUT_DIR/pytest.log")

t0=$(date +%s)
timeout "${GPU_CHECK_TIMINGS_TIMEOUT:-75}" "$PYTHON" benchmarks/gpu_timings.py --allow-cpu \
  --csv "$OUT_DIR/timings.csv" >"$OUT_DIR/timings.log" 2>&1
rc=$?
cat "$OUT_DIR/timings.log"
if [ "$rc" = 0 ]; then res=DONE; else res="FAIL (rc $rc)"; status=1; fi
summary+=("timings  $res  timings.csv [$(( $(date +%s) - t0 ))s]")

if [ "${GPU_CHECK_BENCH:-1}" = 1 ] && [ "$MODE" = gpu ]; then
  t0=$(date +%s)
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-120}" "$PYTHON" benchmarks/bench_kernels.py --quick \
    --csv "$OUT_DIR/bench.csv" >"$OUT_DIR/bench.log" 2>&1
  rc=$?
  cat "$OUT_DIR/bench.log"
  if [ "$rc" = 0 ]; then res=PASS; else res="FAIL (rc $rc; ERROR rows or timeout)"; status=1; fi
  summary+=("bench    $res  bench.csv [$(( $(date +%s) - t0 ))s]")
else
  summary+=("bench    SKIPPED ($MODE, GPU_CHECK_BENCH=${GPU_CHECK_BENCH:-1})")
fi

{
  echo "gpu_check summary ($MODE, $(( $(date +%s) - START ))s, logs in $OUT_DIR)"
  for s in "${summary[@]}"; do echo "  $s"; done
  echo "gpu_check: exit status $status (0 = every test passed and every benchmark case was correct)"
} | tee "$OUT_DIR/summary.txt"
exit $status
