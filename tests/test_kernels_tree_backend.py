"""The vLLM Triton tree-attention backend on CPU tensors via the interpreter.

Metadata: vLLM 0.32's own builder (the backend's, from ``CommonAttentionMetadata``)
plus PTD's packed tree masks; its CUDA-graph claim with and without PTD. Forward: vLLM's
per-layer KV tensor (logical ``[blocks, kv_heads, block, 2*hs]``), the step's K/V written
at the slot mapping as vLLM's cache update would, output poisoned with NaN, compared
with the float64 reference. Steps without tree metadata reach vLLM's own forward
untouched; features the kernel lacks raise on tree steps.
"""

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # Before the first Triton import (tests/conftest.py does the same for whole runs).
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("vllm", reason="the tree backend subclasses vLLM's Triton backend; needs vLLM")
from vllm.config import CUDAGraphMode
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionImpl,
    TritonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    attach_tree,
)

try:
    from vllm_ptd import kernels
    from vllm_ptd.attention.triton_tree_backend import (
        TritonTreeAttentionBackend,
        TritonTreeAttentionImpl,
    )
except ImportError:
    # Checkout without install: kernels/ ships as vllm_ptd.kernels only once installed.
    # Alias it just while the backend module imports, so no other test sees the alias.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kernels  # type: ignore[no-redef]

    sys.modules["vllm_ptd.kernels"] = kernels
    try:
        from vllm_ptd.attention.triton_tree_backend import (
            TritonTreeAttentionBackend,
            TritonTreeAttentionImpl,
        )
    finally:
        del sys.modules["vllm_ptd.kernels"]

NUM_HEADS, NUM_KV_HEADS, HEAD, BLOCK = 4, 2, 64, 16


def make_impl(**overrides) -> TritonTreeAttentionImpl:
    kwargs = {
        "num_heads": NUM_HEADS,
        "head_size": HEAD,
        "scale": HEAD**-0.5,
        "num_kv_heads": NUM_KV_HEADS,
        "alibi_slopes": None,
        "sliding_window": None,
        "kv_cache_dtype": "auto",
    }
    kwargs.update(overrides)
    return TritonTreeAttentionBackend.get_impl_cls()(**kwargs)


def make_step(gen: torch.Generator) -> tuple[dict, list, TritonAttentionMetadata]:
    q_lens, ctx_lens = [7, 1, 12], [20, 33, 0]  # tree, plain decode, prefill chunk
    parents_list = [[-1, 0, 0, 1, -1, 4, 4], None, None]
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    num_blocks, max_blocks = 12, 4
    table = torch.randperm(num_blocks, generator=gen)[: 3 * max_blocks]
    block_table = table.view(3, max_blocks).to(torch.int32)
    kv = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK, 2 * HEAD, generator=gen)
    num_tokens = sum(q_lens) + 2  # 2 padding tokens, as with CUDA-graph padding
    query = torch.randn(num_tokens, NUM_HEADS, HEAD, generator=gen)
    qsl = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    metadata = TritonAttentionMetadata(
        num_actual_tokens=sum(q_lens),
        max_query_len=max(q_lens),
        query_start_loc=qsl.to(DEVICE),
        max_seq_len=max(seq_lens),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=block_table.to(DEVICE),
        slot_mapping=torch.empty(0),
        seq_threshold_3D=0,
        num_par_softmax_segments=16,
        softmax_segm_output=None,
        softmax_segm_max=None,
        softmax_segm_expsum=None,
        causal=True,
    )
    tensors = {"query": query.to(DEVICE), "kv_cache": kv.to(DEVICE)}
    return tensors, parents_list, metadata


def test_tree_step_uses_tree_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    t, parents_list, md = make_step(gen)
    impl = make_impl()
    assert impl.tree_unsupported is None
    rows = [
        kernels.pack_bool_mask(kernels.tree_mask_dense(parents_list[0]), 1),
        torch.full((13, 1), -1, dtype=torch.int32),  # non-tree rows: never read
    ]
    tree = TreeAttentionMetadata(
        mask_bits=torch.cat(rows).to(DEVICE),
        mask_words=1,
        is_tree=torch.tensor([1, 0, 0], dtype=torch.int32, device=DEVICE),
    )
    output = torch.full_like(t["query"], float("nan"))
    attach_tree({"layer": md}, tree)
    impl.forward(None, t["query"], None, None, t["kv_cache"], md, output)

    key_cache, value_cache = t["kv_cache"].transpose(1, 2).split(HEAD, dim=-1)
    ref = kernels.tree_attention_ref(
        t["query"][:20],
        key_cache,
        value_cache,
        md.block_table,
        md.seq_lens,
        md.query_start_loc,
        parents_list,
        HEAD**-0.5,
    )
    err = ((output[:20].double() - ref).norm() / ref.norm()).item()
    assert err < 1e-4
    assert output[20:].isnan().all()  # padding tokens untouched


def test_plain_step_runs_vllm_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(
        TritonAttentionImpl, "forward", lambda self, *a, **k: calls.append(a) or a[-1]
    )
    gen = torch.Generator().manual_seed(1)
    t, _, md = make_step(gen)
    output = torch.empty_like(t["query"])
    make_impl().forward(None, t["query"], None, None, t["kv_cache"], md, output)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "overrides,reason",
    [
        ({"sliding_window": 64}, "sliding_window"),
        ({"logits_soft_cap": 30.0}, "logits_soft_cap"),
        ({"alibi_slopes": [0.5, 0.25, 0.125, 0.0625]}, "ALiBi"),
        ({"sinks": torch.zeros(NUM_HEADS)}, "sinks"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
        ({"attn_type": AttentionType.ENCODER_ONLY}, "attention type"),
    ],
)
def test_tree_step_on_unsupported_layer_raises(overrides: dict, reason: str) -> None:
    gen = torch.Generator().manual_seed(2)
    t, _, md = make_step(gen)
    impl = make_impl(**overrides)
    assert reason in impl.tree_unsupported
    bits, words = kernels.pack_tree_masks([[-1]] * 20)
    output = torch.empty_like(t["query"])
    attach_tree({"layer": md}, TreeAttentionMetadata(bits, words))
    with pytest.raises(ValueError, match=f"PTD tree attention does not support: .*{reason}"):
        impl.forward(None, t["query"], None, None, t["kv_cache"], md, output)


@pytest.mark.parametrize(
    "field,value",
    [("causal", False), ("mm_prefix_range_tensor", torch.zeros(3, 1, 2))],
)
def test_tree_step_with_unsupported_step_metadata_raises(field: str, value) -> None:
    gen = torch.Generator().manual_seed(3)
    t, _, md = make_step(gen)
    setattr(md, field, value)
    bits, words = kernels.pack_tree_masks([[-1]] * 20)
    output = torch.empty_like(t["query"])
    attach_tree({"layer": md}, TreeAttentionMetadata(bits, words))
    with pytest.raises(ValueError, match="PTD tree attention does not support"):
        make_impl().forward(None, t["query"], None, None, t["kv_cache"], md, output)


def fake_vllm_config(ptd: bool) -> SimpleNamespace:
    """The parts of a VllmConfig that the Triton metadata builder reads (vLLM 0.33's also
    reads the speculative token count, parallel drafting and max_num_seqs)."""
    model = SimpleNamespace(
        get_num_attention_heads=lambda parallel: NUM_HEADS,
        get_num_kv_heads=lambda parallel: NUM_KV_HEADS,
        get_head_size=lambda: HEAD,
        rswa_window=None,
    )
    spec = SimpleNamespace(method="custom_class", ptd={"max_nodes": 64},
                           num_speculative_tokens=64, parallel_drafting=False) if ptd else None
    return SimpleNamespace(
        model_config=model,
        parallel_config=None,
        scheduler_config=SimpleNamespace(max_num_seqs=256),
        speculative_config=spec,
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.NONE, static_forward_context={}
        ),
    )


def kv_spec(dtype: torch.dtype) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=NUM_KV_HEADS, head_size=HEAD, dtype=dtype
    )


def test_cuda_graph_support_is_limited_only_under_ptd() -> None:
    builder = TritonTreeAttentionBackend.get_builder_cls()
    spec = kv_spec(torch.float16)
    with_ptd = builder.get_cudagraph_support(fake_vllm_config(True), spec)
    without = builder.get_cudagraph_support(fake_vllm_config(False), spec)
    assert with_ptd == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert without == AttentionCGSupport.ALWAYS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_builder_metadata_and_forward_match_reference(dtype: torch.dtype) -> None:
    """vLLM's builder (the backend's) turns CommonAttentionMetadata into the backend's
    metadata; the runner's packed masks ride beside it; the step's K/V go in at the
    slot mapping; the forward matches the float64 reference on every real row."""
    gen = torch.Generator().manual_seed(4)
    # tree after a prefix ending mid-block, plain decode, prefill chunk, 40-node tree
    q_lens, ctx_lens = [9, 1, 21, 40], [27, 16, 0, 5]
    parents_list = [
        [-1, 0, 0, 1, 1, -1, 5, 6, 5],
        None,
        None,
        [-1] + [max(0, i - 3) for i in range(1, 40)],
    ]
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    num_reqs, max_blocks = len(q_lens), 4
    num_blocks = num_reqs * max_blocks + 2
    table = torch.randperm(num_blocks, generator=gen)[: num_reqs * max_blocks]
    block_table = table.view(num_reqs, max_blocks).to(torch.int32)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    num_actual = int(qsl[-1])
    slots = []
    for r in range(num_reqs):
        for i in range(q_lens[r]):
            pos = ctx_lens[r] + i  # logical KV index, not the tree position
            slots.append(int(block_table[r, pos // BLOCK]) * BLOCK + pos % BLOCK)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(DEVICE),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        num_reqs=num_reqs,
        num_actual_tokens=num_actual,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table.to(DEVICE),
        slot_mapping=slot_mapping.to(DEVICE),
    )
    builder = TritonTreeAttentionBackend.get_builder_cls()(
        kv_spec(dtype), ["layer.0"], fake_vllm_config(True), torch.device(DEVICE)
    )
    md = builder.build(common_prefix_len=0, common_attn_metadata=common)
    assert md.num_actual_tokens == num_actual and md.max_query_len == 40
    assert torch.equal(md.block_table.cpu(), block_table)

    kv = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK, 2 * HEAD, generator=gen)
    kv = kv.to(dtype).to(DEVICE)
    num_tokens = num_actual + 3  # CUDA-graph-style padding rows
    query = torch.randn(num_tokens, NUM_HEADS, HEAD, generator=gen).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD, generator=gen).to(dtype)
    value = torch.randn(num_tokens, NUM_KV_HEADS, HEAD, generator=gen).to(dtype)
    query, key, value = query.to(DEVICE), key.to(DEVICE), value.to(DEVICE)
    # vLLM's do_kv_cache_update: the step's K/V land at the slot mapping.
    slot_major = kv.transpose(1, 2)  # [blocks, block, kv_heads, 2*hs]
    blk, off = md.slot_mapping // BLOCK, md.slot_mapping % BLOCK
    slot_major[blk, off] = torch.cat([key, value], dim=-1)[:num_actual]

    tree_blocks = [p for p in parents_list if p is not None]
    bits, words = kernels.pack_tree_masks(tree_blocks)
    rows, t = [], 0
    for r, p in enumerate(parents_list):  # causal requests' rows: all-ones garbage
        if p is None:
            rows.append(torch.full((q_lens[r], words), -1, dtype=torch.int32))
        else:
            rows.append(bits[t : t + q_lens[r]])
            t += q_lens[r]
    tree = TreeAttentionMetadata(
        mask_bits=torch.cat(rows).to(DEVICE),
        mask_words=words,
        is_tree=torch.tensor([1, 0, 0, 1], dtype=torch.int32, device=DEVICE),
    )
    output = torch.full_like(query, float("nan"))
    impl = make_impl()
    attach_tree({"layer": md}, tree)
    impl.forward(None, query, key, value, kv, md, output)

    key_cache, value_cache = kv.transpose(1, 2).split(HEAD, dim=-1)
    ref = kernels.tree_attention_ref(
        query[:num_actual],
        key_cache,
        value_cache,
        md.block_table,
        md.seq_lens,
        md.query_start_loc,
        parents_list,
        HEAD**-0.5,
    )
    assert not output[:num_actual].isnan().any()
    assert output[num_actual:].isnan().all()  # padding rows untouched
    err = ((output[:num_actual].double() - ref).norm() / ref.norm()).item()
    assert err < {torch.float32: 1e-4, torch.bfloat16: 1e-2}[dtype]
