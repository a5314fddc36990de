import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import budget
from collections import Counter
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
orig = budget.BudgetPolicy.chain_plan
calls = []
def plan(self, classes):
    keep, v = orig(self, classes); calls.append((len(classes), keep, tuple(classes[:1]))); return keep, v
budget.BudgetPolicy.chain_plan = plan
orig_len = budget.BudgetPolicy.chain_length
steps = []
def length(self, classes):
    calls.clear(); n = orig_len(self, classes); steps.append((len(classes), n, [c for c in calls])); return n
budget.BudgetPolicy.chain_length = length
for ds, tr in traces.items():
    steps.clear()
    r = rd.replay_ptd(tr, {}, cost, online_cost=True)
    n = len(steps)
    empty = sum(1 for L, k, _ in steps if L == 0)
    cut0 = Counter(c[2][0] // 24 for L, k, cs in steps if L > 0 and k == 0 for c in cs[:1] if c[2])
    print(ds, f"chain_length calls {n}: no candidate {empty/n:.2f}, declined {sum(1 for L,k,_ in steps if L>0 and k==0)/n:.2f}, ran {sum(1 for L,k,_ in steps if k>0)/n:.2f}; declined by first row's source: {dict(cut0)}")
