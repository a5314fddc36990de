"""KV compaction (Triton and PyTorch) vs a one-pair-at-a-time Python reference.

Random requests with random accepted paths, shuffled block tables, several layers,
both layouts. Caches hold random data (never zeros); every slot is compared, so both a
missed copy and a stray write fail.
"""

import importlib
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

interpreter_active = importlib.import_module(f"{kernels.__name__}._runtime").interpreter_active

if DEVICE == "cpu" and not interpreter_active():
    raise RuntimeError(
        "Triton was imported before TRITON_INTERPRET=1 was set; without a GPU the "
        "kernel tests need it (see tests/conftest.py)"
    )


def random_compaction(
    num_reqs: int, block_size: int, num_blocks: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs (src, dst, pair_start_loc) as PTD produces them after verification.

    Request r's block starts at logical index ctx (x); accepted C nodes have block
    indices a_1 < a_2 < ... (>= 1) and move to ctx + 1, ctx + 2, ...
    """
    perm = torch.randperm(num_blocks, generator=gen)
    per_req = num_blocks // num_reqs
    src, dst, starts = [], [], [0]
    for r in range(num_reqs):
        table = perm[r * per_req : (r + 1) * per_req]
        capacity = per_req * block_size
        q_len = int(torch.randint(1, min(24, capacity // 2), (1,), generator=gen))
        ctx = int(torch.randint(0, capacity - q_len + 1, (1,), generator=gen))
        num_acc = int(torch.randint(0, q_len, (1,), generator=gen))
        accepted = (
            (torch.randperm(q_len - 1, generator=gen)[:num_acc] + 1).sort().values
        )

        def slot(t: int, table: torch.Tensor = table) -> int:
            return int(table[t // block_size]) * block_size + t % block_size

        for j, a in enumerate(accepted.tolist()):
            src.append(slot(ctx + a))
            dst.append(slot(ctx + 1 + j))
        starts.append(len(src))
    as_long = {"dtype": torch.int64, "device": DEVICE}
    return (
        torch.tensor(src, **as_long),
        torch.tensor(dst, **as_long),
        torch.tensor(starts, **as_long),
    )


def sequential_reference(views: list[torch.Tensor], src: list, dst: list) -> None:
    for view in views:
        bs = view.shape[1]
        for s, d in zip(src, dst):
            view[d // bs, d % bs] = view[s // bs, s % bs].clone()


def make_caches(
    layout: str,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> list:
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)

    if layout == "cpu":
        return [
            rand(num_blocks, num_kv_heads, block_size, 2 * head_size)
            for _ in range(num_layers)
        ]
    return [
        (
            rand(num_blocks, block_size, num_kv_heads, head_size),
            rand(num_blocks, block_size, num_kv_heads, head_size),
        )
        for _ in range(num_layers)
    ]


def slot_views(caches: list, layout: str) -> list[torch.Tensor]:
    if layout == "cpu":
        return [c.transpose(1, 2) for c in caches]
    return [t for pair in caches for t in pair]


def clone_caches(caches: list, layout: str) -> list:
    if layout == "cpu":
        return [c.clone() for c in caches]
    return [(k.clone(), v.clone()) for k, v in caches]


@pytest.mark.parametrize("layout", ["cuda", "cpu"])
@pytest.mark.parametrize(
    "dtype,head_size,block_size",
    [
        (torch.float16, 64, 16),
        (torch.bfloat16, 128, 32),
        (torch.float32, 64, 16),
    ],
)
@pytest.mark.parametrize("grouped", [True, False])
def test_compaction_matches_sequential_copy(
    layout: str, dtype: torch.dtype, head_size: int, block_size: int, grouped: bool
) -> None:
    gen = torch.Generator().manual_seed(head_size + block_size + len(layout))
    num_blocks, num_kv_heads = 24, 3
    caches = make_caches(
        layout, 3, num_blocks, block_size, num_kv_heads, head_size, dtype, gen
    )
    src, dst, starts = random_compaction(4, block_size, num_blocks, gen)
    assert src.numel() > 0 and bool((src != dst).any())
    kernels.check_compaction_order(src, dst, starts)

    expected = clone_caches(caches, layout)
    sequential_reference(slot_views(expected, layout), src.tolist(), dst.tolist())
    by_torch = clone_caches(caches, layout)
    kernels.compact_kv_torch(by_torch, src, dst, layout=layout)
    by_triton = clone_caches(caches, layout)
    kernels.compact_kv(
        by_triton, src, dst, starts if grouped else None, layout=layout, validate=True
    )

    for want, got_t, got_k in zip(
        slot_views(expected, layout),
        slot_views(by_torch, layout),
        slot_views(by_triton, layout),
    ):
        assert torch.equal(got_t, want)
        assert torch.equal(got_k, want)


def test_overlapping_chain_is_copied_in_order() -> None:
    """dst of a later pair equals src of an earlier one: 2->1, 3->2, 5->3."""
    gen = torch.Generator().manual_seed(0)
    caches = make_caches("cuda", 1, 2, 16, 2, 64, torch.float32, gen)
    src = torch.tensor([2, 3, 5], device=DEVICE)
    dst = torch.tensor([1, 2, 3], device=DEVICE)
    original = caches[0][0].clone()
    kernels.compact_kv(caches, src, dst, layout="cuda", validate=True)
    got = caches[0][0]
    for s, d in zip([2, 3, 5], [1, 2, 3]):
        assert torch.equal(got[0, d], original[0, s])
    assert torch.equal(got[0, 4], original[0, 4]) and torch.equal(got[1], original[1])


@pytest.mark.parametrize(
    "src,dst,starts",
    [
        ([3, 2], [2, 1], None),  # second pair reads slot 2 after it was written
        ([4, 5], [2, 2], None),  # two pairs write one slot
        ([4, 9], [1, 4], [0, 1, 2]),  # group 1 writes group 0's source slot
    ],
)
def test_unsafe_pair_orders_are_rejected(
    src: list, dst: list, starts: list | None
) -> None:
    with pytest.raises(ValueError):
        kernels.check_compaction_order(
            torch.tensor(src),
            torch.tensor(dst),
            None if starts is None else torch.tensor(starts),
        )


def test_unknown_layout_is_rejected() -> None:
    with pytest.raises(ValueError, match="layout"):
        kernels.compact_kv_torch(
            [torch.zeros(1, 1, 16, 2)],
            torch.tensor([1]),
            torch.tensor([0]),
            layout="nhd",
        )


def max_overlap_pairs(
    tables: list[list[int]], ctxs: list[int], lengths: list[int], block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accepted block indices 2, 3, ..., L+1 for every request: each destination is the
    previous pair's source, the most overlap step 4's order argument allows."""
    src, dst, starts = [], [], [0]
    for table, ctx, n in zip(tables, ctxs, lengths):

        def slot(t: int, table: list[int] = table) -> int:
            return table[t // block_size] * block_size + t % block_size

        src += [slot(ctx + 2 + j) for j in range(n)]
        dst += [slot(ctx + 1 + j) for j in range(n)]
        starts.append(len(src))
    as_long = {"dtype": torch.int64, "device": DEVICE}
    return (
        torch.tensor(src, **as_long),
        torch.tensor(dst, **as_long),
        torch.tensor(starts, **as_long),
    )


@pytest.mark.parametrize("layout", ["cuda", "cpu"])
def test_maximal_overlap_across_block_boundaries_with_poisoned_destinations(
    layout: str,
) -> None:
    """Chains whose every destination is the previous pair's source, crossing blocks of
    shuffled tables, several requests and layers at once. Slots that are only written
    (never read) start as NaN, so a skipped copy leaves a NaN behind."""
    gen = torch.Generator().manual_seed(42)
    block_size, num_blocks = 16, 12
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [perm[0:4], perm[4:8], perm[8:12]]
    ctxs, lengths = [13, 30, 0], [20, 9, 40]  # chains cross 2, 1 and 2 block edges
    src, dst, starts = max_overlap_pairs(tables, ctxs, lengths, block_size)
    kernels.check_compaction_order(src, dst, starts)
    caches = make_caches(layout, 3, num_blocks, block_size, 2, 64, torch.float16, gen)
    only_written = sorted(set(dst.tolist()) - set(src.tolist()))
    assert len(only_written) == 3  # the last destination of each request
    for view in slot_views(caches, layout):
        for d in only_written:
            view[d // block_size, d % block_size] = float("nan")

    expected = clone_caches(caches, layout)
    sequential_reference(slot_views(expected, layout), src.tolist(), dst.tolist())
    by_triton = clone_caches(caches, layout)
    kernels.compact_kv(by_triton, src, dst, starts, layout=layout, validate=True)
    by_torch = clone_caches(caches, layout)
    kernels.compact_kv_torch(by_torch, src, dst, layout=layout)
    for want, got_k, got_t in zip(
        slot_views(expected, layout),
        slot_views(by_triton, layout),
        slot_views(by_torch, layout),
    ):
        assert not want.isnan().any() and not got_k.isnan().any()
        assert torch.equal(got_k, want) and torch.equal(got_t, want)
    # In reverse order the chain would copy already-moved data: the test can tell.
    backwards = clone_caches(caches, layout)
    sequential_reference(
        slot_views(backwards, layout), src.flip(0).tolist(), dst.flip(0).tolist()
    )
    assert not all(
        torch.equal(a, b)
        for a, b in zip(slot_views(backwards, layout), slot_views(expected, layout))
    )


class _CountingKernel:
    """Wraps the Triton kernel to count launches."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_all_layers_move_in_one_launch_and_head_chunks_stay_ordered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 layers (16 K/V views) in one launch; 40 KV heads of 128 split into two head
    chunks, each walking the overlapping chain in order."""
    module = sys.modules[kernels.compact_kv.__module__]
    counter = _CountingKernel(module._compact_kernel)
    monkeypatch.setattr(module, "_compact_kernel", counter)
    gen = torch.Generator().manual_seed(9)
    block_size, num_blocks = 32, 4
    table = torch.randperm(num_blocks, generator=gen).tolist()
    src, dst, starts = max_overlap_pairs([table], [25], [12], block_size)
    caches = make_caches("cuda", 8, num_blocks, block_size, 40, 128, torch.bfloat16, gen)
    expected = clone_caches(caches, "cuda")
    sequential_reference(slot_views(expected, "cuda"), src.tolist(), dst.tolist())
    kernels.compact_kv(caches, src, dst, starts, layout="cuda")
    assert len(counter.grids) == 1
    assert counter.grids[0] == (1, 2, 16)
    for want, got in zip(slot_views(expected, "cuda"), slot_views(caches, "cuda")):
        assert torch.equal(got, want)


def test_layers_of_different_shapes_each_get_a_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = sys.modules[kernels.compact_kv.__module__]
    counter = _CountingKernel(module._compact_kernel)
    monkeypatch.setattr(module, "_compact_kernel", counter)
    gen = torch.Generator().manual_seed(10)
    caches = make_caches("cpu", 2, 4, 16, 2, 64, torch.float32, gen) + make_caches(
        "cpu", 1, 4, 16, 1, 128, torch.float32, gen
    )
    src, dst, starts = max_overlap_pairs([[2, 0, 3, 1]], [5], [14], 16)
    expected = clone_caches(caches, "cpu")
    sequential_reference(slot_views(expected, "cpu"), src.tolist(), dst.tolist())
    kernels.compact_kv(caches, src, dst, starts, layout="cpu")
    assert len(counter.grids) == 2
    for want, got in zip(slot_views(expected, "cpu"), slot_views(caches, "cpu")):
        assert torch.equal(got, want)
