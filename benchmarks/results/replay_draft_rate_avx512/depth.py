"""Per decode step: share of steps drafting, rows, and accepted >= k, suffix against PTD (replay)."""
import json, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
acc_orig = rd._accepted
log = []
def acc(chain, output, pos):
    k = acc_orig(chain, output, pos); log.append((len(chain), k)); return k
rd._accepted = acc
for ds, tr in traces.items():
    out = []
    for name, fn in (("suffix", lambda: rd.replay_suffix(tr, cost)),
                     ("ptd", lambda: rd.replay_ptd(tr, {}, cost, online_cost=True))):
        log.clear(); r = fn(); n = len(log)
        drafted = sum(1 for rows, _ in log if rows)
        ge = [sum(1 for _, k in log if k >= d) / n for d in (1, 2, 3, 4)]
        first = sum(1 for rows, k in log if rows and k >= 1) / max(drafted, 1)
        out.append(f"{name}: drafts {drafted/n:.2f} rows/draft {sum(r for r,_ in log)/max(drafted,1):.1f} first-row acc {first:.2f} >=k {' '.join(f'{g:.2f}' for g in ge)}")
    print(ds, " | ".join(out))
