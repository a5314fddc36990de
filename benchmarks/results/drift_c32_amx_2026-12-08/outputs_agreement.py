"""How many outputs of each (method, pass) equal those of every other, in one
`vllm-ptd bench --save-outputs` results file (the rows in the same order as the columns).
Usage: python THIS RESULTS.json"""
import json
import sys

with open(sys.argv[1]) as results:
    rows = json.load(results)["rows"]
outputs = {(r["method"], r["dataset"]): r["outputs"] for r in rows}
for key, mine in outputs.items():
    print(key, [sum(a == b for a, b in zip(mine, theirs)) for theirs in outputs.values()])
