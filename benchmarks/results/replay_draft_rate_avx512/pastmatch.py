"""Replay at batch 1, cost model online: a match row deeper than `factor` x its matched n-gram
in classes of its own (suffix drafts at most the match's length)."""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import budget as bg, chain as ch, request_state as rs
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
plain = 1 / cost.seconds(0)
nb = ch.NUM_NGRAM_BUCKETS; ND = 8
orig_follow = ch._follow
F = {"f": None}
def follow(origin, ngram, path, agree, pool_root, limit):
    tokens, classes = orig_follow(origin, ngram, path, agree, pool_root, limit)
    if F["f"] is None:
        return tokens, classes
    out = []
    for d, cls in enumerate(classes):
        src, rest = divmod(cls, ch.CLASSES_PER_SOURCE)   # original layout: nb * 4
        b, dep = divmod(rest, 4)
        past = int(d + 1 > F["f"] * max(ngram, 1))
        out.append((src * nb + b) * ND + dep + 4 * past)
    return tokens, out
ch._follow = follow
Orig = bg.BudgetPolicy
def factory(*a, **k):
    p = Orig(*a, **k)
    if F["f"] is not None:
        bg.CLASSES_PER_SOURCE = nb * ND
        p.rows_model = bg.RowAcceptanceModel(ch.NUM_SOURCES * nb * ND)
    else:
        bg.CLASSES_PER_SOURCE = ch.CLASSES_PER_SOURCE
    return p
rd_bp = bg.BudgetPolicy
bg.BudgetPolicy = factory
vs = [None, 1.0, 2.0]
print("| set | suffix | " + " | ".join(str(v) for v in vs) + " |")
for ds, tr in traces.items():
    cells = [rd.replay_suffix(tr, cost)]
    for v in vs:
        F["f"] = v; cells.append(rd.replay_ptd(tr, {}, cost, online_cost=True))
    print(f"| {ds} | " + " | ".join(f"{r['rate']/plain:.3f}x ({r['DE']:.2f}, {r['rows']:.1f})" for r in cells) + " |", flush=True)
