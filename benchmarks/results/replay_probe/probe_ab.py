"""Replay with the chain prices of a loaded step (replay_drafting.LOADED_LINES_MS), probing
on/off (RowAcceptanceModel.probe_below 8 / 0). Usage: python THIS benchmarks/results/replay_headroom/traces_tune.json"""
import json, sys
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import budget as bg
traces = json.load(open(sys.argv[1]))
Orig = bg.BudgetPolicy
SET = {}
def factory(*args, **kw):
    p = Orig(*args, **kw)
    p.rows_model.probe_below = 8.0 if SET["probe"] else 0.0
    return p
bg.BudgetPolicy = factory
cost = rd.StepCost(13.2, 0.4, 1.8)
print("| N | set | first DE off / on | first rows off / on | repeated DE off / on | repeated rows off / on |")
for N, line in rd.LOADED_LINES_MS.items():
    for ds, tr in traces.items():
        cells = {}
        for probe in (False, True):
            SET.update(probe=probe)
            cells[probe] = rd.replay_first_and_repeated(tr, {}, cost, load=(N, line))
        f, o = cells[False], cells[True]
        print(f"| {N} | {ds} | {f[0]:.2f} / {o[0]:.2f} | {f[1]:.1f} / {o[1]:.1f} | {f[2]:.2f} / {o[2]:.2f} | {f[3]:.1f} / {o[3]:.1f} |", flush=True)
