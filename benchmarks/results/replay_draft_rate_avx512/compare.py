import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import request_state, chain, budget
from suffix_beside import ACCEPTED as orig_acc, SuffixBeside
from collections import Counter
traces = json.load(open(sys.argv[1])); cost = rd.StepCost(*map(float, sys.argv[2].split(",")))
orig_cc = chain.candidate_chains
cur = {}
def cc(context, pool_root, limit, depth, matches, shared=None):
    own, other, ng = orig_cc(context, pool_root, limit, depth, matches, shared)
    cur["own"], cur["other"], cur["ng"] = own, other, ng
    cur["hist"] = list(context.tokens)
    return own, other, ng
request_state.candidate_chains = cc
orig_choose = chain.choose_chain
def ch(own, other, ngrams, value=None):
    r = orig_choose(own, other, ngrams, value); cur["chosen"] = "own" if r is own else "other"; return r
request_state.choose_chain = ch
def acc(chainx, output, p):
    k = orig_acc(chainx, output, p)
    if chainx:
        d = beside.draft(cur["hist"], output, p)
        a = orig_acc(d, output, p)
        own_a = orig_acc(cur["own"][0], output, p); oth_a = orig_acc(cur["other"][0], output, p) if cur["other"] else 0
        own3 = min(own_a, 3); oth3 = min(oth_a, 3); suf3 = min(a, 3); ptd3 = min(k, 3)
        st["n"] += 1; st["suf3"] += suf3; st["ptd3"] += ptd3; st["own3"] += own3; st["oth3"] += oth3
        st["best3"] += max(own3, oth3)
        st["same_first"] += bool(d) and d[0] == chainx[0]
        st["suf_first_ok"] += a >= 1; st["ptd_first_ok"] += k >= 1
        st["own_first_ok"] += own_a >= 1; st["oth_first_ok"] += oth_a >= 1
        st["suf_draft"] += bool(d)
        st["ng_own"] += cur["ng"][0]; st["ng_oth"] += cur["ng"][1]
    beside.committed(output, p, k)
    return k
rd._accepted = acc
for ds, tr in traces.items():
    beside = SuffixBeside()
    cur.clear(); st = Counter()
    rd.replay_ptd(tr, {}, cost, online_cost=True)
    beside.close()
    n = st["n"]
    print(ds, f"PTD ran {n} steps; accepted within 3 rows: PTD {st['ptd3']/n:.2f}, own uncut {st['own3']/n:.2f}, shared uncut {st['oth3']/n:.2f}, better of two {st['best3']/n:.2f}, suffix {st['suf3']/n:.2f}; first row ok: PTD {st['ptd_first_ok']/n:.2f} own {st['own_first_ok']/n:.2f} shared {st['oth_first_ok']/n:.2f} suffix {st['suf_first_ok']/n:.2f} (suffix drafts {st['suf_draft']/n:.2f}); same first token {st['same_first']/n:.2f}; mean ngram own {st['ng_own']/n:.1f} shared {st['ng_oth']/n:.1f}")
