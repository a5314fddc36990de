"""Replay: chain pricing margin (BudgetPolicy.min_improvement) 0.8-1.3. Usage: python THIS traces.json"""
import json, sys
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import budget as bg
Orig = bg.BudgetPolicy
MI = [1.15]
def factory(*a, **k):
    p = Orig(*a, **k); p.min_improvement = MI[0]; return p
bg.BudgetPolicy = factory
traces = json.load(open(sys.argv[1]))
cost = rd.StepCost(*rd.DEFAULT_STEP_MS)
plain = 1 / cost.seconds(0)
for ds, tr in traces.items():
    cells = []
    for mi in (0.8, 1.0, 1.15, 1.3):
        MI[0] = mi
        r = rd.replay_ptd(tr, {}, cost)
        cells.append("%.2f: %.3fx DE %.2f r %.1f" % (mi, r["rate"]/plain, r["DE"], r["rows"]))
    print(ds, " | ".join(cells))
