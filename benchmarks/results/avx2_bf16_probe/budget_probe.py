"""What PTD's budget learns at batch 1 where every extra GEMM row costs about a whole row of
the step (bf16 on a CPU without AVX512-BF16/AMX: vLLM's oneDNN linear cannot be created and
torch's fallback is linear in rows). Prints the fitted step line and the drafts, request by
request. Usage (repository root): python THIS [DTYPE] [REQUESTS]"""
import os, sys, time
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
sys.path.insert(0, "benchmarks")
from vllm import SamplingParams
from ptd_bench.workloads import load_workload, messages_for
from vllm_ptd.engine_utils import make_llm
from vllm_ptd.vllm_integration.introspection import ptd_snapshot

from vllm_ptd.core.step_cost import StepCostModel
SAMPLES = []  # (tokens, seconds, drafting, discarded as an idle gap)
_is_outlier = StepCostModel.is_outlier
def logged_is_outlier(self, tokens, seconds):
    out = _is_outlier(self, tokens, seconds)
    SAMPLES.append((tokens, seconds, out))
    return out
StepCostModel.is_outlier = logged_is_outlier  # in-process engine core: the worker is here

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
convs = load_workload("gsm8k", n, split="tune").conversations
llm = make_llm(None, ptd={}, dtype=dtype)
params = SamplingParams(temperature=0, max_tokens=64)
prev = llm.collective_rpc(ptd_snapshot)[0]
for i, conv in enumerate(convs):
    t0 = time.perf_counter()
    out = llm.chat([{"role": "user", "content": conv[0]}], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    s = llm.collective_rpc(ptd_snapshot)[0]
    steps = s["steps"] - prev.get("steps", 0)
    print(f"request {i}: {len(out[0].outputs[0].token_ids)} tokens in {dt:.1f} s, {steps} steps, "
          f"drafted steps {s['drafted_steps'] - prev['drafted_steps']}, "
          f"cost model {s.get('cost_model_ms')}", flush=True)
    prev = s
    kept = [x for x in SAMPLES if not x[2]]
    dropped = [x for x in SAMPLES if x[2]]
    def mean_by(rows):
        by = {}
        for t, sec, _ in rows:
            by.setdefault(min(t, 9), []).append(sec)
        return {t: (len(v), round(1e3 * sum(v) / len(v))) for t, v in sorted(by.items())}
    print(f"   timed steps so far: kept by tokens (n, mean ms) {mean_by(kept)}; "
          f"dropped as idle {mean_by(dropped)}", flush=True)
