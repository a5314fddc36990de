"""16 GSM8K held-out prompts at once, bf16, one process, split-KV off: plain, suffix, PTD with
full chains (budget off) and with 4-row chains; how many answers differ from plain's
(and, in /tmp/drift/consist.json, from each other's). Usage (repository root): python THIS"""
import os, sys, json
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_ATTN_SPLIT_KV", "0")
sys.path.insert(0, "benchmarks")
from ptd_bench.workloads import load_workload, messages_for
from vllm import SamplingParams
from vllm_ptd.engine_utils import make_llm
convs = load_workload("gsm8k", 16, split="heldout").conversations
configs = {"plain": dict(), "suffix": dict(speculative_config={"method": "suffix"}),
           "ptd_full": dict(ptd={"draft_shape": "chain", "adaptive_budget": False, "shared_outputs": 0}),
           "ptd_full_nodes4": dict(ptd={"draft_shape": "chain", "adaptive_budget": False, "max_nodes": 4, "shared_outputs": 0})}
res = {}
for name, kw in configs.items():
    llm = make_llm(None, dtype="bfloat16", enforce_eager=True, max_num_seqs=16, **kw)
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template(messages_for(c, []), tokenize=False, add_generation_prompt=True) for c in convs]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    res[name] = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    import gc; gc.collect()
    print(name, "differs from plain in", sum(a != b for a, b in zip(res[name], res["plain"])), "of", len(convs), flush=True)
json.dump(res, open("/tmp/drift/consist.json", "w"))
