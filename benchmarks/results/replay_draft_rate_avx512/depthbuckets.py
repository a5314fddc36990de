"""Replay at batch 1, cost model online: deeper rows in classes of their own (depth maps)."""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import budget as bg, chain as ch
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
plain = 1 / cost.seconds(0)
DEPTHS = {"4": [0, 1, 2, 3] + [3] * 12, "4,8": [0, 1, 2, 3] + [4] * 4 + [5] * 8,
          "4,6,10": [0, 1, 2, 3, 4, 4, 5, 5, 5, 5] + [6] * 6,
          "each to 8": [0, 1, 2, 3, 4, 5, 6, 7] + [8] * 8}
Orig = bg.BudgetPolicy
def set_depths(name):
    nb = ch.NUM_NGRAM_BUCKETS; dmap = DEPTHS[name]; nd = max(dmap) + 1
    ch.MAX_DEPTH_BUCKET = len(dmap)
    ch.CLASSES_PER_SOURCE = bg.CLASSES_PER_SOURCE = nb * nd
    ch.NUM_CLASSES = bg.NUM_CLASSES = ch.NUM_SOURCES * nb * nd
    ch._CLASSES = [[[(s * nb + b) * nd + dmap[d] for d in range(len(dmap))]
                    for b in range(nb)] for s in range(ch.NUM_SOURCES)]
def factory(*a, **k):
    p = Orig(*a, **k); p.rows_model = bg.RowAcceptanceModel(bg.NUM_CLASSES); return p
bg.BudgetPolicy = factory
rd_budget = __import__("vllm_ptd.core.budget", fromlist=["x"])
names = sys.argv[3:] or list(DEPTHS)
print("| set | suffix | " + " | ".join(names) + " |")
for ds, tr in traces.items():
    cells = [rd.replay_suffix(tr, cost)]
    for n in names:
        set_depths(n); cells.append(rd.replay_ptd(tr, {}, cost, online_cost=True))
    print(f"| {ds} | " + " | ".join(f"{r['rate']/plain:.3f}x ({r['DE']:.2f}, {r['rows']:.1f})" for r in cells) + " |", flush=True)
