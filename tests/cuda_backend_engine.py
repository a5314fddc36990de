"""Run the real vLLM engine on CPU through PTD's CUDA attention path (a script, run in a fresh
interpreter by tests/test_cuda_backend_in_engine.py).

    python tests/cuda_backend_engine.py {triton|triton_auto|plain} MODEL_DIR OUT_JSON

`plain`: vLLM's stock CPU engine (CPU_ATTN), plain greedy decoding, no PTD.
`triton`: PTD (`draft_shape` "tree") on `TritonTreeAttentionBackend`, its metadata builder,
packed tree masks and the Triton KV compaction, PTD's Triton kernels in Triton's interpreter.
`triton_auto`: the same with `draft_shape` "auto" exploring the other shape after every step
without it, so steps carry one request's tree beside other requests' chains.

THE TEST-ONLY SUBSTITUTIONS (all in `install_substitutions`, nowhere else):

(a) `CpuPlatform.get_attn_backend_cls` returns PTD's `TritonTreeAttentionBackend`. vLLM's CPU
    platform always picks its CPU backend, and PTD registers the Triton one only on CUDA.
(b) `triton_attn.triton_reshape_and_cache_flash` (vLLM's KV cache write, before attention on
    every step) is `_write_kv_cache`, a PyTorch scatter into the same strided K/V views.
(c) `triton_attn.unified_attention` (vLLM's attention on steps without tree metadata:
    prefills, steps without branching trees) is `_causal_paged_attention`, causal attention in
    PyTorch over the same paged cache and block table.
    (b) and (c) because vLLM's CPU build sees no Triton CPU backend (`HAS_TRITON` is False),
    so vLLM's own Triton kernels are placeholders there; PTD's kernels import Triton itself
    and run in the interpreter.

Everything of PTD runs unmodified: the backend's forward on tree steps (PTD's Triton tree
kernel over the batch), `TritonTreeAttentionMetadataBuilder`, `tree_step`'s mask packing,
`StepTransfers`, tree verification and the Triton KV compaction (`compact_kv`). Calls into
PTD's kernels are counted by pass-through wrappers.
"""

from __future__ import annotations

import os

# Before anything imports Triton (vLLM does): the kernels and Triton's own library functions
# are decorated for the interpreter only when this is set at their import.
os.environ["TRITON_INTERPRET"] = "1"
# The engine core and its worker in this process, where the substitutions apply.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

import json
import sys

import torch

TRITON_BACKEND = "vllm_ptd.attention.triton_tree_backend.TritonTreeAttentionBackend"
NEW_TOKENS = 24
JOIN_AFTER = 6   # output tokens of request i before request i+1 joins
UNDRAFTED_TOKENS = 6
CALLS = {"tree_kernel": 0, "tree_kernel_mixed": 0, "compact_kernel": 0, "compact_pairs": 0,
         "plain_attention": 0, "kv_writes": 0}
# Steps as vLLM's runner classified them for CUDA graphs (counted once the engine is built):
# a uniform decode batch is what FULL graphs are captured for and replayed over.
STEPS = {"recording": False, "steps": 0, "with_tree": 0, "uniform": 0, "uniform_with_tree": 0}


def _write_kv_cache(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs):
    """What vLLM's `triton_reshape_and_cache_flash` does for an unquantised cache: row t of
    key/value to slot slot_mapping[t] (-1: padding, skipped). Caches [blocks, block_size,
    kv_heads, head_size], strided views of vLLM's per-layer tensor (written in place)."""
    CALLS["kv_writes"] += 1
    n = slot_mapping.shape[0]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    block_size = key_cache.shape[1]
    key_cache[slots // block_size, slots % block_size] = key[:n][keep].to(key_cache.dtype)
    value_cache[slots // block_size, slots % block_size] = value[:n][keep].to(value_cache.dtype)


def _causal_paged_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                            softmax_scale, causal, window_size, block_table, softcap,
                            q_descale, k_descale, v_descale, **kwargs):
    """Causal attention of each request's query rows over its paged K/V (what vLLM's
    `unified_attention` computes for this model: no window, ALiBi, soft-cap, sinks or
    quantisation), in float32 PyTorch."""
    CALLS["plain_attention"] += 1
    assert causal is True
    assert softcap in (None, 0)
    assert window_size in (None, (-1, -1), [-1, -1])
    for name in ("alibi_slopes", "sinks", "mm_prefix_range", "rswa_prefix_lens",
                 "qq_bias", "output_scale"):
        assert kwargs.get(name) is None, name
    block_size, num_kv_heads = k.shape[1], k.shape[2]
    group = q.shape[1] // num_kv_heads
    starts = cu_seqlens_q.tolist()
    seq_lens = seqused_k.tolist()
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        if hi <= lo:
            continue
        seq_len = seq_lens[r]
        blocks = block_table[r, : -(-seq_len // block_size)].to(torch.int64)
        keys = k[blocks].reshape(-1, num_kv_heads, k.shape[3])[:seq_len].float()
        values = v[blocks].reshape(-1, num_kv_heads, v.shape[3])[:seq_len].float()
        keys = keys.repeat_interleave(group, dim=1)        # [L, H, hs]
        values = values.repeat_interleave(group, dim=1)
        query = q[lo:hi].float()                           # [ql, H, hs]
        scores = torch.einsum("qhd,khd->hqk", query, keys) * softmax_scale
        rows = torch.arange(seq_len - (hi - lo), seq_len)[:, None]
        scores.masked_fill_(torch.arange(seq_len)[None, :] > rows, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, values).to(out.dtype)


def install_substitutions() -> None:
    """The test-only substitutions (a), (b), (c) of the module docstring, and the
    pass-through call counters on PTD's kernels."""
    import vllm_ptd.kernels
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends import triton_attn

    from vllm_ptd.attention import triton_tree_backend

    # (a)
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        assert not attn_selector_config.use_mla and not attn_selector_config.use_sparse
        return TRITON_BACKEND

    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    # (b), (c)
    triton_attn.triton_reshape_and_cache_flash = _write_kv_cache
    triton_attn.unified_attention = _causal_paged_attention

    # Counters only: each wrapper calls PTD's kernel with the same arguments.
    tree_attention = triton_tree_backend.tree_attention
    compact_kv = vllm_ptd.kernels.compact_kv

    def counted_tree_attention(*args, **kwargs):
        CALLS["tree_kernel"] += 1
        # A launch in which some request's rows are not a tree (a prefill chunk or a plain
        # decode row next to the trees): attended causally inside the tree kernel.
        is_tree = kwargs.get("is_tree")
        CALLS["tree_kernel_mixed"] += int(is_tree is not None and bool((is_tree == 0).any()))
        return tree_attention(*args, **kwargs)

    def counted_compact_kv(kv_caches, src_slots, *args, **kwargs):
        CALLS["compact_kernel"] += 1
        CALLS["compact_pairs"] += int(src_slots.numel())
        return compact_kv(kv_caches, src_slots, *args, **kwargs)

    triton_tree_backend.tree_attention = counted_tree_attention
    vllm_ptd.kernels.compact_kv = counted_compact_kv   # imported at each compaction
    count_graph_classification()


def count_graph_classification() -> None:
    """Pass-through wrappers on vLLM's step classification: per engine step, whether vLLM
    took it for the uniform decode batch (`_is_uniform_decode`, as
    `_determine_batch_execution_and_padding` asks it) and whether it carried PTD trees."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    is_uniform_decode = GPUModelRunner._is_uniform_decode
    determine = GPUModelRunner._determine_batch_execution_and_padding
    last = {}

    def counted_is_uniform_decode(*args, **kwargs):
        last["uniform"] = is_uniform_decode(*args, **kwargs)
        return last["uniform"]

    def counted_determine(self, *args, **kwargs):
        last.clear()
        result = determine(self, *args, **kwargs)
        if STEPS["recording"]:
            tree = getattr(self.drafter, "step", None) is not None
            STEPS["steps"] += 1
            STEPS["with_tree"] += int(tree)
            STEPS["uniform"] += int(last["uniform"])
            STEPS["uniform_with_tree"] += int(last["uniform"] and tree)
        return result

    GPUModelRunner._is_uniform_decode = staticmethod(counted_is_uniform_decode)
    GPUModelRunner._determine_batch_execution_and_padding = counted_determine


def chat_prompts(model: str) -> list[str]:
    from transformers import AutoTokenizer

    from vllm_ptd.datasets import sample_prompts

    tok = AutoTokenizer.from_pretrained(model)
    questions = [sample_prompts(name, 1)[0] for name in ("gsm8k", "humaneval", "mt_bench")]
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                    add_generation_prompt=True) for q in questions]


def worker_facts(worker) -> dict:
    """Inside the worker: which attention backend and KV compaction PTD runs with."""
    from vllm_ptd.attention.tree_metadata import uses_packed_tree_backend

    runner = worker.model_runner
    backends = sorted({f"{g.backend.__module__}.{g.backend.__qualname__}"
                       for groups in runner.attn_groups for g in groups})
    return {"backends": backends, "packed": uses_packed_tree_backend(runner),
            "device": str(runner.device), "kv_cache_shape": list(runner.kv_caches[0].shape),
            "uniform_decode_query_len": runner.uniform_decode_query_len,
            "dispatcher_uniform_decode_query_len":
                runner.cudagraph_dispatcher.uniform_decode_query_len}


def explore_every_other_step(worker) -> bool:
    """Inside the worker: the shape auto does not prefer runs on one request after every
    step without it, whatever the (interpreted, slow) step timings say."""
    policy = worker.model_runner.drafter.policy
    policy.shape_explore_after = 1
    return policy.auto


def run(mode: str, model: str) -> dict:
    if mode.startswith("triton"):
        from vllm_ptd.kernels._runtime import interpreter_active

        assert interpreter_active(), "Triton was imported before TRITON_INTERPRET=1"
        install_substitutions()
    from vllm import SamplingParams

    from vllm_ptd.engine_utils import make_llm
    from vllm_ptd.vllm_integration.introspection import ptd_snapshot

    ptd = {"triton": {"adaptive_budget": False, "draft_shape": "tree"},
           "triton_auto": {"draft_shape": "auto"}}.get(mode)
    # Blocks of 16 tokens (vLLM's CUDA default) under PTD, so trees and KV moves cross block
    # edges; vLLM's CPU backend takes multiples of 32 only.
    # Processed logprobs: a request asking for logprobs gets no drafts (eligibility.py), the
    # way to have steps in which no request drafts (the last phase below); no other request
    # asks for logprobs.
    llm = make_llm(model=model, ptd=ptd, max_model_len=1024, max_num_seqs=4,
                   block_size=16 if ptd else 32, logprobs_mode="processed_logprobs")
    engine = llm.llm_engine
    if mode == "triton_auto":
        assert llm.collective_rpc(explore_every_other_step) == [True]
    STEPS["recording"] = True
    prompts = chat_prompts(model)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)

    def snap() -> dict:
        return llm.collective_rpc(ptd_snapshot)[0] if ptd else {}

    # Request i+1 joins once request i has JOIN_AFTER output tokens: mid-flight, while the
    # requests before it decode (through trees in the triton run).
    names = [f"req{i}" for i in range(len(prompts))]
    engine.add_request(names[0], prompts[0], params)
    done: dict[str, list[int]] = {}
    produced: dict[str, int] = {}
    joins = []
    while len(done) < len(prompts):
        waiting_on = names[len(joins)] if len(joins) < len(prompts) - 1 else None
        if waiting_on is not None and (produced.get(waiting_on, 0) >= JOIN_AFTER
                                       or waiting_on in done):   # (the test then fails)
            i = len(joins) + 1
            joins.append({"running": [n for n in names[:i] if n not in done],
                          "produced": dict(produced), "snapshot": snap()})
            engine.add_request(names[i], prompts[i], params)
        for out in engine.step():
            produced[out.request_id] = len(out.outputs[0].token_ids)
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    # Last, a request PTD does not draft for, alone: its decode steps carry no draft rows.
    undrafted = SamplingParams(temperature=0.0, max_tokens=UNDRAFTED_TOKENS, logprobs=1)
    engine.add_request("undrafted", prompts[0], undrafted)
    while "undrafted" not in done:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    result = {"outputs": [done[n] for n in names], "undrafted": done["undrafted"],
              "joins": joins,
              "snapshot": snap(), "calls": dict(CALLS), "steps": dict(STEPS)}
    if ptd:
        result["worker"] = llm.collective_rpc(worker_facts)[0]
    return result


if __name__ == "__main__":
    mode, model, out_path = sys.argv[1:4]
    result = run(mode, model)
    with open(out_path, "w") as f:
        json.dump(result, f, default=str)
    # vLLM's in-process engine may keep threads alive; the result is written.
    os._exit(0)
