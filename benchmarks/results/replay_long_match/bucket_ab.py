"""Replay with a loaded step's chain prices (as replay_probe/probe_ab.py), matches of
match_length (32) tokens in a bucket of their own or with the 12+ ones (A/B).
Usage: python THIS TRACES.json LONG[,PRIOR] [long|short:DEPTHS ...] (baseline short:4 first)"""
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import budget as bg, chain as ch
traces = json.load(open(sys.argv[1]))
SET = {}
LONG = int(sys.argv[2].split(",")[0])
SET["long_prior"] = float(sys.argv[2].split(",")[1]) if "," in sys.argv[2] else 0.0
Orig = bg.BudgetPolicy


DEPTHS = {"4": [0, 1, 2, 3] + [3] * 12, "4,8": [0, 1, 2, 3] + [4] * 4 + [5] * 8,
          "4,6,10": [0, 1, 2, 3, 4, 4, 5, 5, 5, 5] + [6] * 6}


def set_buckets(long_bucket: bool, depths: str = "4") -> None:
    nb = 7 if long_bucket else 6
    dmap = DEPTHS[depths]
    nd = max(dmap) + 1
    ch.NUM_NGRAM_BUCKETS = nb
    ch.MAX_DEPTH_BUCKET = len(dmap)   # the tables' depth index cap; classes use dmap
    ch.NUM_CLASSES = ch.NUM_SOURCES * nb * nd
    bg.NUM_CLASSES = ch.NUM_CLASSES
    ch._CLASSES = [[[(s * nb + b) * nd + dmap[d] for d in range(len(dmap))]
                    for b in range(nb)] for s in range(ch.NUM_SOURCES)]
    def bucket(n):
        if long_bucket and n >= LONG:
            return 6
        return ch.NGRAM_BUCKETS[n] if n < len(ch.NGRAM_BUCKETS) else 5
    ch.ngram_bucket = bucket


def factory(*args, **kw):
    p = Orig(*args, **kw)
    p.rows_model = bg.RowAcceptanceModel(bg.NUM_CLASSES)
    if SET.get("long_prior") and ch.NUM_NGRAM_BUCKETS == 7:
        m = p.rows_model
        for s in range(ch.NUM_SOURCES):
            for c in set(ch._CLASSES[s][6]):
                m._hit[c] = SET["long_prior"] * m._seen[c]
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
VARIANTS = [(False, "4")] + [tuple(v.split(":")) for v in sys.argv[3:]]
VARIANTS = [(v[0] in (True, "long"), v[1]) for v in VARIANTS]
print("variants:", VARIANTS)
print("| N | set | first DE | first rows | repeated DE | repeated rows |")
print("|---|---|---|---|---|---|")
for N, line in LINES.items():
    for ds, tr in traces.items():
        cells = {}
        for var in VARIANTS:
            set_buckets(*var)
            SET.update(N=N, line=line)
            r1 = rd.replay_ptd(tr, {}, cost)
            r2 = rd.replay_ptd(tr + tr, {}, cost)
            t1 = sum(len(t["output"]) - 1 for t in tr)
            s1 = t1 / r1["DE"]; s2 = 2 * t1 / r2["DE"]
            rows2 = (r2["rows"] * s2 - r1["rows"] * s1) / (s2 - s1)
            cells[var] = (r1["DE"], r1["rows"], t1 / (s2 - s1), rows2)
        cols = [" / ".join(f"{cells[v][i]:.2f}" for v in VARIANTS) for i in range(4)]
        print(f"| {N} | {ds} | " + " | ".join(cols) + " |", flush=True)
