"""In PTD's replayed batch-1 steps with no candidate chain (neither the request's own context
nor the shared outputs match), would vLLM's suffix drafter have drafted, and what would it have
had accepted? A suffix cache (vLLM's `suffix` settings, earlier responses kept) is fed each
request's prompt and committed tokens beside PTD's replay."""
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import request_state, chain
from suffix_beside import ACCEPTED as orig_acc, SuffixBeside
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
def acc(chainx, output, p):
    k = orig_acc(chainx, output, p)
    d = beside.draft(cur["hist"], output, p)
    s["steps"] += 1
    kind = cur["kind"]
    e = s.setdefault(kind, {"n": 0, "ptd_rows": 0, "ptd_acc": 0, "drafts": 0, "rows": 0, "acc": 0})
    e["n"] += 1; e["ptd_rows"] += len(chainx); e["ptd_acc"] += k
    if d:
        e["drafts"] += 1; e["rows"] += len(d); e["acc"] += orig_acc(d, output, p)
    beside.committed(output, p, k)
    return k
rd._accepted = acc
for ds, tr in traces.items():
    beside = SuffixBeside()
    cur.clear()
    s = {"steps": 0}
    r = rd.replay_ptd(tr, {}, cost, online_cost=True)
    beside.close()
    parts = []
    for kind in ("none", "declined", "ran"):
        e = s.get(kind, {"n": 0})
        n = max(e["n"], 1)
        parts.append(f"{kind} {e['n']/s['steps']:.2f} of steps: PTD {e.get('ptd_rows',0)/n:.1f} rows, {e.get('ptd_acc',0)/n:.2f} accepted; suffix at the same point {e.get('rows',0)/n:.1f} rows, {e.get('acc',0)/n:.2f} accepted")
    print(f"{ds} (PTD DE {r['DE']:.2f}): " + " | ".join(parts))
