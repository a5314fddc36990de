"""Replay: choosing between the own-context and shared-outputs chains by the longer match instead of the learned value. Usage: python THIS traces.json"""
import json, sys
sys.path.insert(0, "benchmarks")   # run from the repository root
import replay_drafting as rd
from vllm_ptd.core import request_state as rs
from vllm_ptd.core import chain as ch
orig = ch.choose_chain
traces = json.load(open(sys.argv[1]))
cost = rd.StepCost(*rd.DEFAULT_STEP_MS)
plain = 1 / cost.seconds(0)
for ds, tr in traces.items():
    rs.choose_chain = orig
    a = rd.replay_ptd(tr, {}, cost)
    rs.choose_chain = lambda own, other, ngrams, value=None: orig(own, other, ngrams, None)
    b = rd.replay_ptd(tr, {}, cost)
    print(ds, "learned: %.3fx DE %.3f rows %.2f | longer-match: %.3fx DE %.3f rows %.2f" % (a["rate"]/plain, a["DE"], a["rows"], b["rate"]/plain, b["DE"], b["rows"]))
