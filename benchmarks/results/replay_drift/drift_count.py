"""Answers of the repeated pass that differ from the same method's first pass, per
concurrency and set, in `vllm-ptd bench --repeat --save-outputs` results.
Usage: python THIS RESULTS.json [...]"""
import json, sys
for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    out = {}
    for r in rows:
        if r["dataset"].endswith(", repeated"):
            continue
        rep = next(x for x in rows if x["dataset"] == r["dataset"] + ", repeated" and x["method"] == r["method"] and x["concurrency"] == r["concurrency"])
        n = sum(a != b for a, b in zip(r["outputs"], rep["outputs"]))
        out.setdefault((r["concurrency"], r["dataset"]), []).append(f"{r['method']} {n}/{len(r['outputs'])}")
    for k, v in out.items():
        print(path.split('/')[-2], k, ", ".join(v))
