"""Which op first rounds a position differently when its row rides in a drafted step?
Plain vs a speculative method at batch 1, bf16, one process (in-process engine core, bound to
core 0); forward hooks record, per position, the last computation whose input token is plain's
answer's, op by op, layer by layer, up to the first differing answer token. Saves the first
differing o_proj call's input rows to o_proj_input.pt (for o_proj_rows_in_engine.py).
Usage (repository root): python THIS SET INDEX ngram|suffix|ptd"""
import os, sys, gc
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
sys.path.insert(0, "benchmarks")
import torch
from ptd_bench.workloads import load_workload, messages_for
from vllm import SamplingParams
from vllm_ptd.engine_utils import make_llm

SET, IDX = sys.argv[1], int(sys.argv[2])
METHOD = sys.argv[3]
conv = load_workload(SET, IDX + 1, split="heldout").conversations[IDX]
REC = {}
OPS = ["input_layernorm", "self_attn.qkv_proj", "self_attn.attn", "self_attn.o_proj",
       "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj"]

def install(model):
    state = {}
    inner = model.model
    def pre_ids(mod, args):
        state["ids"] = args[0].clone()
    def pre_pos(mod, args, kwargs):
        state["pos"] = kwargs.get("positions", args[0] if args else None).clone()
    inner.embed_tokens.register_forward_pre_hook(pre_ids)
    inner.layers[0].register_forward_pre_hook(pre_pos, with_kwargs=True)
    for li, layer in enumerate(inner.layers):
        for op in OPS:
            mod = layer.get_submodule(op)
            def hook(m, a, out, key=(li, op)):
                t = out[0] if isinstance(out, tuple) else out
                ids, pos = state["ids"], state["pos"]
                if t.shape[0] != ids.shape[0]:
                    return
                for r in range(t.shape[0]):
                    REC[(int(pos[r]), key)] = (int(ids[r]), t[r].detach().float().clone())
                if key[1] == "self_attn.o_proj":
                    x = a[0]
                    for r in range(t.shape[0]):
                        REC[(int(pos[r]), (key[0], "o_in"))] = (x.detach().clone(), r, tuple(x.stride()), x.is_contiguous())
            mod.register_forward_hook(hook)
    def final(m, a, out):
        t = out[0] if isinstance(out, tuple) else out
        ids, pos = state["ids"], state["pos"]
        for r in range(t.shape[0]):
            REC[(int(pos[r]), "final")] = (int(ids[r]), t[r].detach().float().clone())
    inner.norm.register_forward_hook(final)
    return True

def run(kw):
    REC.clear()
    llm = make_llm(None, dtype="bfloat16", max_num_seqs=1, **kw)
    llm.apply_model(install)
    tok = llm.get_tokenizer()
    p = tok.apply_chat_template(messages_for(conv, []), tokenize=False, add_generation_prompt=True)
    o = llm.generate([p], SamplingParams(temperature=0, max_tokens=128), use_tqdm=False)[0]
    rec = dict(REC)
    del llm; gc.collect()
    return list(o.prompt_token_ids), list(o.outputs[0].token_ids), rec

kws = {"ngram": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 3}),
       "suffix": dict(speculative_config={"method": "suffix"}),
       "ptd": dict(ptd={"draft_shape": "chain", "shared_outputs": 0})}
pids, plain, prec = run({})
_, spec, srec = run(kws[METHOD])
k = next((j for j, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
print("first differing output index", k, "of", len(plain))
seq = pids + plain
limit = len(pids) + (k if k is not None else len(plain))
keys = [(li, op) for li in range(30) for op in OPS] + ["final"]
first = None
for pos in range(len(pids), limit):
    for key in keys:
        a, b = prec.get((pos, key)), srec.get((pos, key))
        if a is None or b is None:
            continue
        assert a[0] == seq[pos], (pos, key)
        if b[0] != seq[pos]:
            continue
        if not torch.equal(a[1], b[1]):
            first = (pos - len(pids), key, float((a[1] - b[1]).abs().max()))
            break
    if first:
        break
print("first differing (output index, op, max abs diff):", first)
if first:
    pos = first[0] + len(pids); li = first[1][0]
    for name, rec in (("plain", prec), ("spec", srec)):
        x, r, stride, contig = rec[(pos, (li, "o_in"))]
        print(name, "o_proj call rows", x.shape, "row", r, "stride", stride, "contiguous", contig)
    torch.save({"plain": prec[(pos, (li, "o_in"))], "spec": srec[(pos, (li, "o_in"))], "layer": li}, "o_proj_input.pt")
