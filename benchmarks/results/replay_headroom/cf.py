"""Counterfactual: after each step, the unchosen candidate's rows are scored against the
committed tokens and recorded in the row model too. (The shipped shadow verification,
core/shadow.py, grew from this trial; with it in the build, "off" here no longer means no
counterfactual rows.)"""
import json, sys
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import request_state as rs
from vllm_ptd.core import chain as ch
from vllm_ptd.core import budget as bg

MODE = ["off"]
pending = {}
orig_choose_chain = ch.choose_chain
def choose_chain(own, other, ngrams, value=None):
    res = orig_choose_chain(own, other, ngrams, value)
    pending["alt"] = [c for c in (own, other) if c is not None and c[0] != res[0]]
    return res
rs.choose_chain = choose_chain

orig_record = bg.BudgetPolicy.record_chain
COMMITTED = {}
def record_chain(self, classes, rows, accepted):
    orig_record(self, classes, rows, accepted)
    if MODE[0] == "off":
        return
    committed = COMMITTED.get("c")
    for toks, cls in pending.pop("alt", []):
        L = len(committed)
        a = 0
        while a < min(L, len(toks)) and toks[a] == committed[a]:
            a += 1
        n = min(len(toks), a + 1) if a < L else a
        if n:
            self.rows_model.record(cls[:n], a)
bg.BudgetPolicy.record_chain = record_chain

orig_acc = rd._accepted
def _accepted(chain, output, pos):
    k = orig_acc(chain, output, pos)
    COMMITTED["c"] = output[pos:pos + k + 1]
    return k
rd._accepted = _accepted

traces = json.load(open(sys.argv[1]))
cost = rd.StepCost(*rd.DEFAULT_STEP_MS)
plain = 1 / cost.seconds(0)
for ds, tr in traces.items():
    cells = []
    for m in ("off", "on"):
        MODE[0] = m; pending.clear()
        r = rd.replay_ptd(tr, {}, cost)
        cells.append("%s: %.3fx DE %.3f r %.2f" % (m, r["rate"]/plain, r["DE"], r["rows"]))
    print(ds, " | ".join(cells))
