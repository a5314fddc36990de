"""Which PTD setting makes repeated answers drift? In-process engines (two threads),
split-KV off, bf16, GSM8K held out, 32 at once, 64 tokens: each PTD config answers twice,
caches kept; drifted = second answers that differ from the first. The first argument 1
patches vLLM's CPU LM head to compute 32 rows at a time (row-count invariant).
Usage (repository root): python THIS 0|1 '{"draft_shape":"chain"}' ...   (PTD configs)"""
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
sys.path.insert(0, "benchmarks")
import torch
import vllm.model_executor.layers.utils as U
if sys.argv[1] == "1":
    orig = U.dispatch_cpu_unquantized_gemm
    def patched(layer, remove_weight):
        N = layer.weight.shape[0] if layer.weight.ndim == 2 else 0
        orig(layer, remove_weight)
        if N >= 40000:
            f = layer.cpu_linear
            layer.cpu_linear = lambda x, w, b: (f(x, w, b) if x.shape[0] <= 32 else
                torch.cat([f(x[i:i + 32].contiguous(), w, b) for i in range(0, x.shape[0], 32)]))
    U.dispatch_cpu_unquantized_gemm = patched
from ptd_bench.workloads import load_workload, messages_for
from vllm import SamplingParams
from vllm_ptd.engine_utils import make_llm
convs = load_workload("gsm8k", 32, split="heldout").conversations
import json
variants = [(v, dict(ptd=json.loads(v))) for v in sys.argv[2:]]
for name, kw in variants:
    llm = make_llm(None, dtype="bfloat16", enforce_eager=True, max_num_seqs=32, **kw)
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template(messages_for(c, []), tokenize=False, add_generation_prompt=True) for c in convs]
    sp = SamplingParams(temperature=0, max_tokens=64)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    a = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    b = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    print(name, "drifted", sum(x != y for x, y in zip(a, b)), "of 32", flush=True)
    del llm
    import gc; gc.collect()
