"""Replay: PTD's chains capped at `factor` x their matched n-gram (suffix's max_spec_factor)."""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import request_state, chain
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
plain = 1 / cost.seconds(0)
orig_cc = chain.candidate_chains
F = {"f": None, "min": 1}
def cc(context, pool_root, limit, depth, matches, shared=None):
    own, other, ng = orig_cc(context, pool_root, limit, depth, matches, shared)
    if F["f"] is None: return own, other, ng
    def cap(c, n):
        if c is None: return None
        k = max(F["min"], int(F["f"] * n))
        return (c[0][:k], c[1][:k])
    return cap(own, ng[0]), cap(other, ng[1]), ng
request_state.candidate_chains = cc
vs = [(None, 1), (1.0, 1), (2.0, 1), (3.0, 2), (4.0, 2)]
for ds, tr in traces.items():
    cells = [rd.replay_suffix(tr, cost)]
    for f, m in vs:
        F["f"], F["min"] = f, m
        cells.append(rd.replay_ptd(tr, {}, cost, online_cost=True))
    print(f"| {ds} | " + " | ".join(f"{r['rate']/plain:.3f}x ({r['DE']:.2f}, {r['rows']:.1f})" for r in cells) + " |")
