"""Replay batch-1 chains with the cost model learning online, for several ridge priors on b."""
import json, sys, time
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import step_cost

traces = json.load(open(sys.argv[1]))
line = tuple(map(float, sys.argv[2].split(",")))
variants = [("default", {}), ("strength 100", {"prior_strength": 100.0}),
            ("strength 30", {"prior_strength": 30.0}), ("slope 3%", {"slope_prior": 0.03}),
            ("offline line", None)]
cost = rd.StepCost(*line)
plain = 1.0 / cost.seconds(0)
print("line", line, "| set | suffix | " + " | ".join(v for v, _ in variants))
from vllm_ptd.core import budget
_post = budget.BudgetPolicy.__post_init__
CURRENT = {}
def _patched(self):
    _post(self)
    for k, v in CURRENT.items():
        setattr(self.cost, k, v)
budget.BudgetPolicy.__post_init__ = _patched
for ds, tr in traces.items():
    cells = [rd.replay_suffix(tr, cost)]
    for label, kw in variants:
        CURRENT.clear(); CURRENT.update(kw or {})
        cells.append(rd.replay_ptd(tr, {}, cost, online_cost=kw is not None))
    print(f"| {ds} | " + " | ".join(f"{r['rate']/plain:.3f}x ({r['DE']:.2f}, {r['rows']:.1f})" for r in cells) + " |", flush=True)
