"""Batch 1, bf16, vLLM's default multiprocess engine (one bound core): which methods' greedy
answers differ from plain decoding's, and where (answer, first differing token, plain's top-2
logprob margin there). `ptd0` is PTD drafting nothing.
Usage (repository root): python THIS [SET] [N] [plain,ptd,suffix,...]   -> divergence_SET.json"""
import os, sys, json, gc
sys.path.insert(0, "benchmarks")
from ptd_bench.workloads import load_workload, messages_for
from vllm import SamplingParams
from vllm_ptd.engine_utils import make_llm
SET = sys.argv[1] if len(sys.argv) > 1 else "mbpp"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 10
names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["plain", "ptd0", "ptd", "suffix"]
def main():
    convs = load_workload(SET, N, split="heldout").conversations
    configs = {"plain": dict(), "suffix": dict(speculative_config={"method": "suffix"}),
               "ptd0": dict(ptd={"draft_shape": "chain", "max_nodes": 0, "shared_outputs": 0}),
               "ptdfull": dict(ptd={"draft_shape": "chain", "adaptive_budget": False, "shared_outputs": 0}),
               "ptd": dict(ptd={"draft_shape": "chain"})}
    res = {}
    for name in names:
        llm = make_llm(None, dtype="bfloat16", max_num_seqs=1, **configs[name])
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template(messages_for(c, []), tokenize=False, add_generation_prompt=True) for c in convs]
        sp = SamplingParams(temperature=0, max_tokens=128, logprobs=2 if name == "plain" else None)
        toks, margins = [], []
        for p in prompts:
            o = llm.generate([p], sp, use_tqdm=False)[0].outputs[0]
            toks.append(list(o.token_ids))
            if o.logprobs:
                m = []
                for lp in o.logprobs:
                    v = sorted((x.logprob for x in lp.values()), reverse=True)
                    m.append(v[0] - v[1] if len(v) > 1 else 99.0)
                margins.append(m)
        res[name] = toks
        if margins: res["margins"] = margins
        del llm; gc.collect()
        if name != "plain" and "plain" in res:
            diffs = []
            for i, (a, b) in enumerate(zip(toks, res["plain"])):
                if a != b:
                    k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    diffs.append((i, k, round(res["margins"][i][k], 5) if k < len(res["margins"][i]) else None))
            print(name, "differs from plain in", len(diffs), "of", len(toks), diffs, flush=True)
    json.dump(res, open(f"divergence_{SET}.json", "w"))

if __name__ == '__main__':
    main()
