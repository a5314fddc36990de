"""The kernels on vLLM-style K/V views: several layers carved out of one buffer.

vLLM 0.32 allocates one buffer per KV-cache group and hands each layer a strided 4-D
view of its logical shape ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``
(K then V in the last dim); the buffer's physical order is a ``KVCacheLayout``
(``vllm/v1/kv_cache_layout.py``, logical axes ``[L, B, H, N, C]``):

* ``LBNHC``: ``[layers, blocks, block_size, heads, 2*hs]`` (layer-major, vLLM's default),
* ``BLNHC``: ``[blocks, layers, block_size, heads, 2*hs]`` (block-major: one layer's
  blocks are ``layers`` pages apart),
* ``LBHNC``: ``[layers, blocks, heads, block_size, 2*hs]`` (HND, one extra case).

The Triton backend views a layer as ``kv.transpose(1, 2).split(hs, -1)``: K and V
``[blocks, block_size, heads, hs]`` with non-contiguous strides. Tree attention runs on
one layer's views of such a buffer; KV compaction on all layers at once, in both of its
layouts (``"cpu"``: the per-layer logical views, ``"cuda"``: the K/V pairs), and must
leave every byte outside the moved slots untouched. dtypes bf16/fp16/fp32, head sizes
64 and 128, GQA (4 query heads on 2 KV heads). Compiled on a GPU; through Triton's
interpreter on CPU (tiny shapes, same cases). No vLLM needed.
"""

import itertools
import zlib

import pytest
import torch
from kernel_imports import DEVICE, kernels

# Same bounds as tests/test_kernels_tree_attention.py (the device tool's METHOD.md).
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("LBNHC", "BLNHC", "LBHNC")
NUM_LAYERS, Q_HEADS, KV_HEADS, BLOCK = 3, 4, 2, 16


def carve_layers(
    layout: str,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(buffer, per-layer logical views ``[B, H, N, 2*hs]``) in ``layout``'s memory order."""
    c = 2 * head
    if layout == "LBNHC":
        raw = torch.randn(num_layers, num_blocks, block_size, kv_heads, c, generator=gen)
    elif layout == "BLNHC":
        raw = torch.randn(num_blocks, num_layers, block_size, kv_heads, c, generator=gen)
    elif layout == "LBHNC":
        raw = torch.randn(num_layers, num_blocks, kv_heads, block_size, c, generator=gen)
    else:
        raise ValueError(layout)
    raw = raw.to(dtype).to(DEVICE)
    if layout == "LBNHC":
        views = [raw[layer].permute(0, 2, 1, 3) for layer in range(num_layers)]
    elif layout == "BLNHC":
        views = [raw[:, layer].permute(0, 2, 1, 3) for layer in range(num_layers)]
    else:
        views = [raw[layer] for layer in range(num_layers)]
    for view in views:
        assert view.shape == (num_blocks, kv_heads, block_size, c)
        assert view.data_ptr() >= raw.data_ptr()
    return raw, views


def split_kv(view: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton backend's K and V views of one layer (``[B, N, H, hs]``, strided)."""
    key_cache, value_cache = view.transpose(1, 2).split(head, dim=-1)
    return key_cache, value_cache


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    parents = [-1]
    for i in range(1, n):
        r = torch.rand(1, generator=gen).item()
        parents.append(-1 if r < 0.1 else int(torch.randint(0, i, (1,), generator=gen)))
    return parents


def attention_cases() -> list:
    """Every (layout, dtype, head size); the third layout once. Cheap enough for the
    interpreter too (a few seconds), so CPU and GPU run the same cases."""
    full = list(itertools.product(LAYOUTS[:2], DTYPES, (64, 128)))
    return [*full, ("LBHNC", "fp32", 64), ("LBHNC", "bf16", 128)]


@pytest.mark.parametrize(("layout", "dtype_name", "head"), attention_cases())
def test_tree_attention_on_one_layer_of_a_shared_buffer(
    layout: str, dtype_name: str, head: int
) -> None:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{layout}{dtype_name}{head}".encode()))
    # Two requests: a tree block after a prefix crossing block edges, and a causal
    # (plain decode / prefill) block; shuffled block tables.
    q_lens, ctx_lens = [7, 3], [21, 12]
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    per_req = [-(-s // BLOCK) for s in seq_lens]
    num_blocks = sum(per_req) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((2, max(per_req)), num_blocks - 1, dtype=torch.int32)
    used = 0
    for r, nb in enumerate(per_req):
        table[r, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
    _, views = carve_layers(layout, NUM_LAYERS, num_blocks, BLOCK, KV_HEADS, head, dtype, gen)
    key_cache, value_cache = split_kv(views[1], head)  # a middle layer
    assert not key_cache.is_contiguous() and not value_cache.is_contiguous()
    parents_list = [random_parents(q_lens[0], gen), None]
    qsl = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=DEVICE)
    query = torch.randn(sum(q_lens), Q_HEADS, head, generator=gen).to(dtype).to(DEVICE)
    batch = {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": table.to(DEVICE),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        "query_start_loc": qsl,
    }
    mask_words = 1
    mask_bits = torch.cat(
        [
            kernels.pack_bool_mask(kernels.tree_mask_dense(parents_list[0]), mask_words),
            torch.full((q_lens[1], mask_words), -1, dtype=torch.int32),  # never read
        ]
    ).to(DEVICE)
    is_tree = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    scale = head**-0.5
    out = torch.full_like(query, float("nan"))
    kernels.tree_attention(
        **batch,
        mask_bits=mask_bits,
        mask_words=mask_words,
        scale=scale,
        out=out,
        max_query_len=max(q_lens),
        is_tree=is_tree,
    )
    ref = kernels.tree_attention_ref(**batch, parents_list=parents_list, scale=scale)
    assert not out.isnan().any(), "unwritten (NaN) output elements"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"{layout} {dtype_name} hs={head}: relative error {err:.2e}"


def compaction_pairs(
    num_blocks: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two requests on shuffled blocks; request 0's pairs chain across a block edge
    (every destination is the previous pair's source)."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [perm[: num_blocks // 2], perm[num_blocks // 2 :]]

    def slot(r: int, t: int) -> int:
        return tables[r][t // BLOCK] * BLOCK + t % BLOCK

    ctx0, ctx1 = BLOCK - 3, 5  # request 0's block straddles a block edge
    pairs0 = [(ctx0 + 1 + j + 1, ctx0 + 1 + j) for j in range(5)]  # src = next dst
    pairs1 = [(ctx1 + 2, ctx1 + 1), (ctx1 + 6, ctx1 + 2), (ctx1 + 7, ctx1 + 3)]
    src = [slot(0, s) for s, _ in pairs0] + [slot(1, s) for s, _ in pairs1]
    dst = [slot(0, d) for _, d in pairs0] + [slot(1, d) for _, d in pairs1]
    as_long = {"dtype": torch.int64, "device": DEVICE}
    return (
        torch.tensor(src, **as_long),
        torch.tensor(dst, **as_long),
        torch.tensor([0, len(pairs0), len(src)], **as_long),
    )


def compaction_cases() -> list:
    return list(itertools.product(LAYOUTS, ("cpu", "cuda"), DTYPES, (64, 128)))


@pytest.mark.parametrize(("layout", "kv_layout", "dtype_name", "head"), compaction_cases())
def test_compaction_moves_every_layer_of_a_shared_buffer_and_nothing_else(
    layout: str, kv_layout: str, dtype_name: str, head: int
) -> None:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(7)
    num_blocks = 6
    raw, views = carve_layers(layout, NUM_LAYERS, num_blocks, BLOCK, KV_HEADS, head, dtype, gen)
    src, dst, starts = compaction_pairs(num_blocks, gen)
    before = raw.clone()
    expected_raw = raw.clone()
    if layout == "LBNHC":
        expected_views = [expected_raw[i].permute(0, 2, 1, 3) for i in range(NUM_LAYERS)]
    elif layout == "BLNHC":
        expected_views = [expected_raw[:, i].permute(0, 2, 1, 3) for i in range(NUM_LAYERS)]
    else:
        expected_views = [expected_raw[i] for i in range(NUM_LAYERS)]
    # Reference: one pair at a time, in order, on the per-layer slot-major views.
    for view in expected_views:
        slot_major = view.transpose(1, 2)
        for s, d in zip(src.tolist(), dst.tolist()):
            slot_major[d // BLOCK, d % BLOCK] = slot_major[s // BLOCK, s % BLOCK].clone()
    caches = views if kv_layout == "cpu" else [split_kv(v, head) for v in views]
    kernels.compact_kv(caches, src, dst, starts, layout=kv_layout, validate=True)
    assert torch.equal(raw, expected_raw), f"{layout}/{kv_layout}: buffer differs"
    assert not torch.equal(raw, before), "the pairs moved nothing"
    compaction = kernels.kv_compaction
    launches = compaction._launch_groups(compaction._slot_major_views(caches, kv_layout))
    assert len(launches) == 1, "all layers of one buffer share strides: one launch"


def test_torch_compaction_agrees_on_block_major_views() -> None:
    """compact_kv_torch (the reference and CPU path) on BLNHC views, K/V pairs."""
    gen = torch.Generator().manual_seed(3)
    raw, views = carve_layers("BLNHC", NUM_LAYERS, 6, BLOCK, KV_HEADS, 64, torch.float32, gen)
    src, dst, starts = compaction_pairs(6, gen)
    other = raw.clone()
    other_views = [other[:, i].permute(0, 2, 1, 3) for i in range(NUM_LAYERS)]
    kernels.compact_kv([split_kv(v, 64) for v in views], src, dst, starts, layout="cuda")
    kernels.compact_kv_torch([split_kv(v, 64) for v in other_views], src, dst, layout="cuda")
    assert torch.equal(raw, other)
