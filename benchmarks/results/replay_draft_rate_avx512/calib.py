"""Calibration of the chain policy's predicted acceptance in replay: predicted sum of P_k over
the rows a chain keeps against the rows accepted, by the depth of the row."""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import budget

traces = json.load(open(sys.argv[1]))
cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
orig_plan = budget.BudgetPolicy.chain_plan
last = {}
def plan(self, classes):
    keep, value = orig_plan(self, classes)
    p, ps = 1.0, []
    for cls in list(classes)[:keep]:
        p *= self.rows_model._rate(cls); ps.append(p)
    last["ps"] = ps
    return keep, value
budget.BudgetPolicy.chain_plan = plan
orig_record = budget.BudgetPolicy.record_chain
stats = {}
def record(self, classes, rows, accepted):
    ps = last.pop("ps", None)
    if rows and ps:
        for k, p in enumerate(ps[:rows]):
            s = stats.setdefault(min(k, 5), [0.0, 0.0, 0])
            s[0] += p; s[1] += float(accepted > k); s[2] += 1
    return orig_record(self, classes, rows, accepted)
budget.BudgetPolicy.record_chain = record
for ds, tr in traces.items():
    stats.clear()
    rd.replay_ptd(tr, {}, cost, online_cost=True)
    print(ds, " ".join(f"d{k+1}: pred {s[0]/s[2]:.2f} got {s[1]/s[2]:.2f} (n={s[2]})" for k, s in sorted(stats.items())))
