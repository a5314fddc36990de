"""Replay with the chain prices of a loaded step (replay_drafting.LOADED_LINES_MS), shadow
verification (core/shadow.py) on / off (off: a shadow never settles, so none teaches the row
model). Usage: python THIS benchmarks/results/replay_headroom/traces_tune.json"""
import json, sys
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import shadow as sh
traces = json.load(open(sys.argv[1]))
feed = sh.ShadowChain.feed
cost = rd.StepCost(13.2, 0.4, 1.8)
print("| N | set | first DE off / on | first rows off / on | repeated DE off / on | repeated rows off / on |")
for N, line in rd.LOADED_LINES_MS.items():
    for ds, tr in traces.items():
        cells = {}
        for on in (False, True):
            sh.ShadowChain.feed = feed if on else (lambda self, committed: None)
            cells[on] = rd.replay_first_and_repeated(tr, {}, cost, load=(N, line))
        f, o = cells[False], cells[True]
        print(f"| {N} | {ds} | {f[0]:.2f} / {o[0]:.2f} | {f[1]:.1f} / {o[1]:.1f} | {f[2]:.2f} / {o[2]:.2f} | {f[3]:.1f} / {o[3]:.1f} |", flush=True)
