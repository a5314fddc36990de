"""Replay with a loaded step's chain prices (replay_drafting.LOADED_LINES_MS), matches of
match_length (32) tokens in a bucket of their own or with the 12+ ones (A/B).
Usage: python THIS TRACES.json LONG[,PRIOR] [long|short:DEPTHS ...] (baseline short:4 first)"""
import json, sys
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
    return p


bg.BudgetPolicy = factory
cost = rd.StepCost(13.2, 0.4, 1.8)
VARIANTS = [(False, "4")] + [tuple(v.split(":")) for v in sys.argv[3:]]
VARIANTS = [(v[0] in (True, "long"), v[1]) for v in VARIANTS]
print("variants:", VARIANTS)
print("| N | set | first DE | first rows | repeated DE | repeated rows |")
print("|---|---|---|---|---|---|")
for N, line in rd.LOADED_LINES_MS.items():
    for ds, tr in traces.items():
        cells = {}
        for var in VARIANTS:
            set_buckets(*var)
            cells[var] = rd.replay_first_and_repeated(tr, {}, cost, load=(N, line))
        cols = [" / ".join(f"{cells[v][i]:.2f}" for v in VARIANTS) for i in range(4)]
        print(f"| {N} | {ds} | " + " | ".join(cols) + " |", flush=True)
