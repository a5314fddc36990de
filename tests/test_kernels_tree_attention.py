"""Tree attention kernel vs a float64 PyTorch reference (quartet: kernel/ref/test/bench).

Runs on CUDA when available, else on CPU tensors through Triton's interpreter (small
shapes). Every input is random (trees, prefix lengths, shuffled block tables, data);
outputs are poisoned with NaN before each run so unwritten rows fail.
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

try:
    from vllm_ptd import kernels
except ImportError:  # running from a checkout: kernels/ is the package source
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kernels  # type: ignore[no-redef]

from kernels._runtime import interpreter_active

if DEVICE == "cpu" and not interpreter_active():
    raise RuntimeError(
        "Triton was imported before TRITON_INTERPRET=1 was set; without a GPU the "
        "kernel tests need it (see tests/conftest.py)"
    )
# ||out - ref|| / ||ref|| bounds per dtype, after the device tool's METHOD.md: float32
# arithmetic "far under 1e-3" (the kernel asks for IEEE fp32 dots, not tf32); bf16
# operands "between 1e-3 and 1e-2", so 1e-2 at most; fp16 has 3 more mantissa bits
# than bf16, so 8x tighter. The reference runs in float64 on the same rounded inputs.
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    """Random topologically ordered forest: token 0 is x, extra roots allowed."""
    parents = [-1]
    for i in range(1, n):
        r = torch.rand(1, generator=gen).item()
        parents.append(-1 if r < 0.1 else int(torch.randint(0, i, (1,), generator=gen)))
    return parents


def make_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    split_kv_view: bool = False,
) -> dict:
    """Random paged batch; block tables draw from one shuffled pool of blocks."""
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_req) + 1
    num_blocks = sum(blocks_per_req) + 3  # spare blocks hold garbage nobody may read
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = torch.full(
        (len(q_lens), max_blocks), num_blocks - 1, dtype=torch.int32
    )
    used = 0
    for r, nb in enumerate(blocks_per_req):
        block_table[r, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
    shape = (num_blocks, num_kv_heads, block_size, 2 * head_size)
    if split_kv_view:
        # vLLM 0.32: one logical [B, H, N, 2*hs] tensor per layer, viewed as K and V.
        kv = torch.randn(shape, generator=gen).to(dtype)
        key_cache, value_cache = kv.transpose(1, 2).split(head_size, dim=-1)
    else:
        kshape = (num_blocks, block_size, num_kv_heads, head_size)
        key_cache = torch.randn(kshape, generator=gen).to(dtype)
        value_cache = torch.randn(kshape, generator=gen).to(dtype)
    total_q = sum(q_lens)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(total_q, num_q_heads, head_size, generator=gen).to(dtype)
    return {
        "query": query.to(DEVICE),
        "key_cache": key_cache.to(DEVICE),
        "value_cache": value_cache.to(DEVICE),
        "block_table": block_table.to(DEVICE),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        "query_start_loc": qsl.to(DEVICE),
    }


def run_and_check(batch: dict, parents_list: list, dtype: torch.dtype, **kw) -> None:
    """Run the kernel on NaN-poisoned output; compare with the float64 reference.

    ``parents_list[r] is None`` marks a causal request: its mask rows are filled with
    all-ones garbage, which would let rows see later tokens if the kernel read them.
    """
    head_size = batch["query"].shape[-1]
    scale = head_size**-0.5
    q_lens = torch.diff(batch["query_start_loc"]).tolist()
    mask_words = -(-max(q_lens) // 32)
    rows = [
        kernels.pack_bool_mask(kernels.tree_mask_dense(p), mask_words)
        if p is not None
        else torch.full((q, mask_words), -1, dtype=torch.int32)
        for p, q in zip(parents_list, q_lens)
    ]
    mask_bits = torch.cat(rows).to(DEVICE)
    out = torch.full_like(batch["query"], float("nan"))
    kernels.tree_attention(
        **batch, mask_bits=mask_bits, mask_words=mask_words, scale=scale, out=out, **kw
    )
    ref = kernels.tree_attention_ref(**batch, parents_list=parents_list, scale=scale)
    assert torch.isfinite(ref).all()
    assert not out.isnan().any(), "unwritten (NaN) output elements"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"relative error {err:.2e} >= {TOL[dtype]:.0e}"


def test_dense_mask_is_self_and_ancestors() -> None:
    parents = [-1, 0, 0, 1, -1, 4]
    mask = kernels.tree_mask_dense(parents)
    expected = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {4}, 5: {4, 5}}
    for i, cols in expected.items():
        assert set(mask[i].nonzero().flatten().tolist()) == cols


def test_packed_mask_round_trips_across_words() -> None:
    gen = torch.Generator().manual_seed(1)
    trees = [random_parents(n, gen) for n in (1, 31, 32, 33, 70)]
    bits, words = kernels.pack_tree_masks(trees)
    assert words == 3 and bits.dtype == torch.int32 and bits.shape == (167, 3)
    row = 0
    for parents in trees:
        n = len(parents)
        unpacked = kernels.unpack_mask_bits(bits[row : row + n], n)
        assert torch.equal(unpacked, kernels.tree_mask_dense(parents))
        row += n


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-1, -2]])
def test_invalid_parent_arrays_are_rejected(parents: list[int]) -> None:
    with pytest.raises(ValueError):
        kernels.tree_mask_dense(parents)


@pytest.mark.parametrize(
    "dtype,head_size,num_q_heads,num_kv_heads,block_size",
    [
        (torch.float32, 64, 4, 4, 16),
        (torch.float32, 128, 8, 2, 32),
        (torch.float16, 64, 6, 2, 16),
        (torch.float16, 128, 4, 2, 32),
        (torch.bfloat16, 64, 8, 2, 64),
        (torch.bfloat16, 128, 4, 1, 16),
    ],
)
def test_tree_attention_matches_reference_on_random_trees(
    dtype: torch.dtype,
    head_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
) -> None:
    gen = torch.Generator().manual_seed(head_size + num_q_heads + block_size)
    num_reqs = 3
    q_lens = [1] + torch.randint(2, 20, (num_reqs - 1,), generator=gen).tolist()
    ctx_lens = [0] + torch.randint(
        1, 3 * block_size, (num_reqs - 1,), generator=gen
    ).tolist()
    parents_list = [random_parents(q, gen) for q in q_lens]
    batch = make_batch(
        q_lens, ctx_lens, num_q_heads, num_kv_heads, head_size, block_size, dtype, gen
    )
    run_and_check(batch, parents_list, dtype)


@pytest.mark.parametrize("seed", range(6))
def test_tree_attention_matches_reference_on_random_configs(seed: int) -> None:
    """Everything drawn at random: dtype, head size, GQA group, block size, batch."""
    gen = torch.Generator().manual_seed(1000 + seed)

    def pick(options: list):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    dtype = pick([torch.float32, torch.float16, torch.bfloat16])
    head_size, block_size = pick([64, 128]), pick([16, 32, 64])
    num_kv_heads, group = pick([1, 2]), pick([1, 2, 3, 4])
    num_reqs = int(torch.randint(1, 6, (1,), generator=gen))
    q_lens = torch.randint(1, 48, (num_reqs,), generator=gen).tolist()
    ctx_lens = torch.randint(0, 160, (num_reqs,), generator=gen).tolist()
    # About a third of the requests are causal blocks (prefill chunk / plain decode)
    # beside the trees, flagged through is_tree.
    causal = torch.rand(num_reqs, generator=gen) < 0.3
    parents_list = [
        None if c else random_parents(q, gen) for c, q in zip(causal.tolist(), q_lens)
    ]
    batch = make_batch(
        q_lens,
        ctx_lens,
        num_kv_heads * group,
        num_kv_heads,
        head_size,
        block_size,
        dtype,
        gen,
        split_kv_view=bool(seed % 2),
    )
    is_tree = (~causal).to(torch.int32).to(DEVICE)
    splits = pick([1, 1, 2, 3])  # split-KV too
    run_and_check(batch, parents_list, dtype, is_tree=is_tree, num_kv_splits=splits)


@pytest.mark.parametrize(
    "dtype,block_size", [(torch.float16, 16), (torch.bfloat16, 32), (torch.float32, 64)]
)
def test_prefixes_ending_mid_block_and_on_block_edges(
    dtype: torch.dtype, block_size: int
) -> None:
    """Committed prefixes that end inside a block (the tree straddles the edge), on an
    edge, one short of it, and empty; the query blocks spill into the next blocks."""
    gen = torch.Generator().manual_seed(block_size)
    bs = block_size
    ctx_lens = [bs // 2 + 3, 2 * bs, 2 * bs - 1, 0, 3 * bs + 1]
    q_lens = [bs, 5, 2, 9, 1]
    parents_list = [random_parents(q, gen) for q in q_lens]
    batch = make_batch(q_lens, ctx_lens, 8, 2, 128, bs, dtype, gen)
    run_and_check(batch, parents_list, dtype)


def test_trees_wider_than_one_mask_word_on_strided_vllm_cache_view() -> None:
    gen = torch.Generator().manual_seed(7)
    q_lens, ctx_lens = [40, 3], [21, 50]
    parents_list = [random_parents(q, gen) for q in q_lens]
    batch = make_batch(
        q_lens, ctx_lens, 4, 2, 64, 16, torch.float32, gen, split_kv_view=True
    )
    assert not batch["key_cache"].is_contiguous()
    run_and_check(batch, parents_list, torch.float32)


def test_mixed_batch_with_causal_requests() -> None:
    gen = torch.Generator().manual_seed(11)
    q_lens, ctx_lens = [37, 6, 1], [0, 18, 30]  # prefill chunk, tree, plain decode
    parents_list = [None, random_parents(6, gen), None]
    batch = make_batch(q_lens, ctx_lens, 2, 1, 64, 16, torch.float32, gen)
    is_tree = torch.tensor([0, 1, 0], dtype=torch.int32, device=DEVICE)
    run_and_check(batch, parents_list, torch.float32, is_tree=is_tree)


def test_rows_past_the_batch_are_left_untouched() -> None:
    gen = torch.Generator().manual_seed(3)
    batch = make_batch([5], [9], 2, 2, 64, 16, torch.float32, gen)
    parents = random_parents(5, gen)
    bits, words = kernels.pack_tree_masks([parents], device=DEVICE)
    padded = torch.full((8, 2, 64), float("nan"), device=DEVICE)  # 3 padding rows
    kernels.tree_attention(
        **batch, mask_bits=bits, mask_words=words, scale=0.125, out=padded
    )
    assert not padded[:5].isnan().any() and padded[5:].isnan().all()


@pytest.mark.parametrize("splits", [2, 3, 5])
def test_split_kv_slices_of_the_prefix_merge_to_the_reference(splits: int) -> None:
    """Split-KV: prefixes cut into slices (some empty: a short or no prefix), trees and
    causal blocks, several mask words, GQA; the merged output equals the reference."""
    gen = torch.Generator().manual_seed(40 + splits)
    q_lens, ctx_lens = [6, 1, 37, 4], [150, 0, 70, 3]
    parents_list = [random_parents(6, gen), None, random_parents(37, gen), None]
    batch = make_batch(
        q_lens, ctx_lens, 4, 2, 64, 16, torch.float32, gen, split_kv_view=True
    )
    is_tree = torch.tensor([1, 0, 1, 0], dtype=torch.int32, device=DEVICE)
    run_and_check(
        batch, parents_list, torch.float32, is_tree=is_tree, num_kv_splits=splits
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_kv_in_half_precision(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    q_lens, ctx_lens = [9, 16], [200, 33]
    parents_list = [random_parents(q, gen) for q in q_lens]
    batch = make_batch(q_lens, ctx_lens, 8, 2, 128, 32, dtype, gen)
    run_and_check(batch, parents_list, dtype, num_kv_splits=4)


def test_split_kv_leaves_rows_past_the_batch_untouched() -> None:
    gen = torch.Generator().manual_seed(3)
    batch = make_batch([5], [90], 2, 2, 64, 16, torch.float32, gen)
    bits, words = kernels.pack_tree_masks([random_parents(5, gen)], device=DEVICE)
    query = torch.cat([batch.pop("query"), torch.zeros(3, 2, 64, device=DEVICE)])
    padded = torch.full((8, 2, 64), float("nan"), device=DEVICE)  # 3 padding rows
    kernels.tree_attention(
        query, **batch, mask_bits=bits, mask_words=words, scale=0.125, out=padded,
        max_query_len=5, num_kv_splits=3,
    )
    assert not padded[:5].isnan().any() and padded[5:].isnan().all()


def test_kv_splits_fill_the_gpu_only_when_the_batch_does_not() -> None:
    choose = kernels.choose_kv_splits
    assert choose(programs=8, max_context=32768, sm_count=132) == 32  # batch 1, 8 heads
    assert choose(programs=8, max_context=8192, sm_count=132) == 8  # slices >= 1024
    assert choose(programs=64, max_context=8192, sm_count=132) == 5  # 2 programs per SM
    assert choose(programs=128, max_context=32768, sm_count=132) == 3
    assert choose(programs=8, max_context=4095, sm_count=132) == 1  # too short to cut
    assert choose(programs=132, max_context=32768, sm_count=132) == 1  # a wave already


@pytest.mark.parametrize(
    "feature",
    [
        {"sliding_window": 128},
        {"alibi_slopes": torch.ones(4)},
        {"logits_soft_cap": 30.0},
        {"sinks": torch.zeros(4)},
        {"kv_cache_dtype": "fp8"},
    ],
)
def test_out_of_scope_features_raise(feature: dict) -> None:
    with pytest.raises(ValueError, match="does not support"):
        kernels.check_supported(**feature)


def test_fp8_kv_cache_tensors_are_rejected() -> None:
    gen = torch.Generator().manual_seed(6)
    batch = make_batch([2], [3], 2, 2, 64, 16, torch.float16, gen)
    for name in ("key_cache", "value_cache"):
        batch[name] = batch[name].to(torch.float8_e4m3fn)
    bits, words = kernels.pack_tree_masks([[-1, 0]], device=DEVICE)
    with pytest.raises(ValueError, match="quantized KV caches are not supported"):
        kernels.tree_attention(
            **batch,
            mask_bits=bits,
            mask_words=words,
            scale=0.1,
            out=torch.empty_like(batch["query"]),
        )


def test_mismatched_kv_dtype_raises() -> None:
    gen = torch.Generator().manual_seed(5)
    batch = make_batch([2], [3], 2, 2, 64, 16, torch.float16, gen)
    batch["query"] = batch["query"].float()
    bits, words = kernels.pack_tree_masks([[-1, 0]], device=DEVICE)
    with pytest.raises(ValueError, match="dtype"):
        kernels.tree_attention(
            **batch,
            mask_bits=bits,
            mask_words=words,
            scale=0.1,
            out=torch.empty_like(batch["query"]),
        )
