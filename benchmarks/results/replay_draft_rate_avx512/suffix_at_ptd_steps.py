"""In PTD's replayed batch-1 steps with no candidate chain (neither the request's own context
nor the shared outputs match), would vLLM's suffix drafter have drafted, and what would it have
had accepted? A suffix cache (vLLM's `suffix` settings, earlier responses kept) is fed each
request's prompt and committed tokens beside PTD's replay."""
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import request_state, chain
from arctic_inference.suffix_decoding import SuffixDecodingCache
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
orig_cc = chain.candidate_chains
cur = {}
def cc(context, pool_root, limit, depth, matches, shared=None):
    own, other, ng = orig_cc(context, pool_root, limit, depth, matches, shared)
    cur["none"] = not own[0] and (other is None or not other[0])
    cur["hist"] = list(context.tokens)
    return own, other, ng
request_state.candidate_chains = cc
from vllm_ptd.core import budget
orig_len = budget.BudgetPolicy.chain_length
def length(self, classes):
    n = orig_len(self, classes); cur["kind"] = "none" if cur.get("none") else ("declined" if n == 0 else "ran"); return n
budget.BudgetPolicy.chain_length = length
State = request_state.PTDRequestState
orig_init = State.__init__
def init(self, cfg, prompt, *a, **k):
    orig_init(self, cfg, prompt, *a, **k)
    if cur.get("rid"): cache.stop_request(cur["rid"])
    cur["n"] = cur.get("n", 0) + 1; cur["rid"] = f"r{cur['n']}"; cur["started"] = False
    cur["prompt"] = list(prompt)
rd.PTDRequestState = State
State.__init__ = init
orig_acc = rd._accepted
def acc(chainx, output, p):
    k = orig_acc(chainx, output, p)
    rid = cur["rid"]
    if not cur["started"]:
        cache.start_request(rid, np.array(cur["prompt"], dtype=np.int32))
        cache.add_active_response(rid, output[:p]); cur["started"] = True
    s["steps"] += 1
    kind = cur["kind"]
    e = s.setdefault(kind, {"n": 0, "ptd_rows": 0, "ptd_acc": 0, "drafts": 0, "rows": 0, "acc": 0})
    e["n"] += 1; e["ptd_rows"] += len(chainx); e["ptd_acc"] += k
    d = list(cache.speculate(rid, np.array(cur["hist"][-24:], dtype=np.int32), max_spec_tokens=24,
                             max_spec_factor=1.0, min_token_prob=0.1).token_ids)
    if d:
        e["drafts"] += 1; e["rows"] += len(d); e["acc"] += orig_acc(d, output, p)
    cache.add_active_response(rid, output[p:p + k + 1])
    return k
rd._accepted = acc
for ds, tr in traces.items():
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    cur.clear()
    s = {"steps": 0}
    r = rd.replay_ptd(tr, {}, cost, online_cost=True)
    parts = []
    for kind in ("none", "declined", "ran"):
        e = s.get(kind, {"n": 0})
        n = max(e["n"], 1)
        parts.append(f"{kind} {e['n']/s['steps']:.2f} of steps: PTD {e.get('ptd_rows',0)/n:.1f} rows, {e.get('ptd_acc',0)/n:.2f} accepted; suffix at the same point {e.get('rows',0)/n:.1f} rows, {e.get('acc',0)/n:.2f} accepted")
    print(f"{ds} (PTD DE {r['DE']:.2f}): " + " | ".join(parts))
