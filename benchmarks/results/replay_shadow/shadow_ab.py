"""Replay with the chain prices of a loaded step (cost lines per batch size below), shadow
verification (core/shadow.py) on / off (off: a shadow never settles, so none teaches the row
model). Usage: python THIS benchmarks/results/replay_headroom/traces_tune.json"""
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import budget as bg
from vllm_ptd.core import shadow as sh
traces = json.load(open(sys.argv[1]))
Orig = bg.BudgetPolicy
feed = sh.ShadowChain.feed
SET = {}
def factory(*args, **kw):
    p = Orig(*args, **kw)
    N, (a_ms, b_ms, c_ms) = SET["N"], SET["line"]
    orig_choose = p.choose
    p.choose = lambda r, d: orig_choose(N, N)
    rng = np.random.default_rng(0)
    for i in range(400):
        drafting = int(rng.integers(0, N + 1)); rows = int(rng.integers(0, 5)) * drafting
        p.cost.observe(N + rows, (a_ms + b_ms * (N + rows) + c_ms * drafting) / 1e3, drafting)
    p.cost.observe = lambda *a, **k: None
    return p
bg.BudgetPolicy = factory
cost = rd.StepCost(13.2, 0.4, 1.8)
LINES = {1: (13.2, 0.4, 1.8), 4: (33.0, 0.42, 1.0), 16: (40.0, 0.36, 0.3), 32: (50.0, 0.31, 0.2)}
print("| N | set | first DE off / on | first rows off / on | repeated DE off / on | repeated rows off / on |")
for N, line in LINES.items():
    for ds, tr in traces.items():
        cells = {}
        for on in (False, True):
            SET.update(N=N, line=line)
            sh.ShadowChain.feed = feed if on else (lambda self, committed: None)
            r1 = rd.replay_ptd(tr, {}, cost)
            r2 = rd.replay_ptd(tr + tr, {}, cost)
            t1 = sum(len(t["output"]) - 1 for t in tr)
            s1 = t1 / r1["DE"]; s2 = 2 * t1 / r2["DE"]
            rows2 = (r2["rows"] * s2 - r1["rows"] * s1) / (s2 - s1)
            cells[on] = (r1["DE"], r1["rows"], t1 / (s2 - s1), rows2)
        f, o = cells[False], cells[True]
        print(f"| {N} | {ds} | {f[0]:.2f} / {o[0]:.2f} | {f[1]:.1f} / {o[1]:.1f} | {f[2]:.2f} / {o[2]:.2f} | {f[3]:.1f} / {o[3]:.1f} |", flush=True)
