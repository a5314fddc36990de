import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from vllm_ptd.core import request_state, chain, budget
from arctic_inference.suffix_decoding import SuffixDecodingCache
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
State = request_state.PTDRequestState
orig_init = State.__init__
def init(self, cfg, prompt, *a, **k):
    orig_init(self, cfg, prompt, *a, **k)
    if cur.get("rid"): cache.stop_request(cur["rid"])
    cur["n"] = cur.get("n", 0) + 1; cur["rid"] = f"r{cur['n']}"; cur["started"] = False
    cur["prompt"] = list(prompt)
State.__init__ = init
orig_acc = rd._accepted
def acc(chainx, output, p):
    k = orig_acc(chainx, output, p)
    rid = cur["rid"]
    if not cur["started"]:
        cache.start_request(rid, np.array(cur["prompt"], dtype=np.int32))
        cache.add_active_response(rid, output[:p]); cur["started"] = True
    if chainx:
        d = list(cache.speculate(rid, np.array(cur["hist"][-24:], dtype=np.int32), max_spec_tokens=24,
                                 max_spec_factor=1.0, min_token_prob=0.1).token_ids)
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
    cache.add_active_response(rid, output[p:p + k + 1])
    return k
rd._accepted = acc
for ds, tr in traces.items():
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    cur.clear(); st = Counter()
    rd.replay_ptd(tr, {}, cost, online_cost=True)
    n = st["n"]
    print(ds, f"PTD ran {n} steps; accepted within 3 rows: PTD {st['ptd3']/n:.2f}, own uncut {st['own3']/n:.2f}, shared uncut {st['oth3']/n:.2f}, better of two {st['best3']/n:.2f}, suffix {st['suf3']/n:.2f}; first row ok: PTD {st['ptd_first_ok']/n:.2f} own {st['own_first_ok']/n:.2f} shared {st['oth_first_ok']/n:.2f} suffix {st['suf_first_ok']/n:.2f} (suffix drafts {st['suf_draft']/n:.2f}); same first token {st['same_first']/n:.2f}; mean ngram own {st['ng_own']/n:.1f} shared {st['ng_oth']/n:.1f}")
