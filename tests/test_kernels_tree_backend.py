"""The vLLM Triton tree-attention backend's forward, on CPU tensors via the interpreter.

Builds vLLM 0.32's per-layer KV tensor (logical ``[blocks, kv_heads, block, 2*hs]``),
writes K/V where vLLM's cache update would, and compares the backend's output on a PTD
step with the float64 reference. Steps without tree metadata must reach vLLM's own
forward untouched.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # Before the first Triton import (tests/conftest.py does the same for whole runs).
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("vllm")
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionImpl,
    TritonAttentionMetadata,
)

from vllm_ptd.attention.tree_metadata import (
    TreeAttentionMetadata,
    tree_attention_step,
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
    with tree_attention_step(tree):
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
    "overrides", [{"sliding_window": 64}, {"logits_soft_cap": 30.0}]
)
def test_tree_step_on_unsupported_layer_raises(overrides: dict) -> None:
    gen = torch.Generator().manual_seed(2)
    t, _, md = make_step(gen)
    impl = make_impl(**overrides)
    bits, words = kernels.pack_tree_masks([[-1]] * 20)
    output = torch.empty_like(t["query"])
    with (
        tree_attention_step(TreeAttentionMetadata(bits, words)),
        pytest.raises(ValueError, match="PTD tree attention"),
    ):
        impl.forward(None, t["query"], None, None, t["kv_cache"], md, output)
