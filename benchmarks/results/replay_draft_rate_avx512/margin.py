import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import budget
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
plain = 1 / cost.seconds(0)
_post = budget.BudgetPolicy.__post_init__
CUR = {}
def post(self):
    _post(self)
    for k, v in CUR.items(): setattr(self, k, v)
budget.BudgetPolicy.__post_init__ = post
variants = [("default", {}), ("margin 1.0", {"min_improvement": 1.0}), ("margin 0.85", {"min_improvement": 0.85}), ("margin 0.7", {"min_improvement": 0.7})]
for ds, tr in traces.items():
    cells = [rd.replay_suffix(tr, cost)]
    for _, kw in variants:
        CUR.clear(); CUR.update(kw); cells.append(rd.replay_ptd(tr, {}, cost, online_cost=True))
    print(f"| {ds} | " + " | ".join(f"{r['rate']/plain:.3f}x ({r['DE']:.2f}, {r['rows']:.1f})" for r in cells) + " |")
