"""KV compaction: move accepted tree nodes' K/V into contiguous slots, all layers.

After verification, request r's accepted C nodes sit at KV slots of their query-block
index (``context_len + i``); they must move to ``context_len + 1, + 2, ...`` right after
x. Slots are flat ids ``block_id * block_size + offset``.

Order safety. Within a request the accepted indices increase and each destination
index is <= its source index, with destinations consecutive. So for pairs k < m:
``src_m > src_k >= dst_k``: a later source is never an earlier destination. Copying
the pairs of one request one after the other, in the given order, therefore never reads
a slot that was already overwritten; only a *later* pair may overwrite an *earlier*
pair's source, after that source was read. Both implementations keep that order: the
Triton kernel runs one program per (request group, KV-head chunk, layer view) that
loops over its group's pairs in order; groups (requests) own disjoint slots and layers
disjoint memory, so those programs run in parallel, all layers in one launch. Inside a
program each (head, d) element is loaded and stored by the same thread (one offsets
tensor for both), so that thread's program order is the only ordering needed, and as
no pair reads an earlier pair's destination, reads fetched early stay correct.
:func:`check_compaction_order` verifies these preconditions on the host.

Layouts:
* ``"cpu"``: one tensor per layer, vLLM 0.32's logical per-layer KV
  ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (K then V in the last
  dim), any physical strides. It is the CPU backend's layout and also what vLLM 0.32
  hands the Triton backend (which views it as ``transpose(1, 2).split(head_size)``).
* ``"cuda"``: a ``(key_cache, value_cache)`` pair per layer, each
  ``[num_blocks, block_size, num_kv_heads, head_size]``, any strides.
"""

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

KVCaches = Sequence[torch.Tensor] | Sequence[tuple[torch.Tensor, torch.Tensor]]


def _slot_major_views(kv_caches: KVCaches, layout: str) -> list[torch.Tensor]:
    """Views ``[num_blocks, block_size, num_kv_heads, D]`` covering all K/V data."""
    views: list[torch.Tensor] = []
    for entry in kv_caches:
        if layout == "cpu":
            if not isinstance(entry, torch.Tensor) or entry.dim() != 4:
                raise ValueError("layout='cpu' takes one 4-D tensor per layer")
            views.append(entry.transpose(1, 2))
        elif layout == "cuda":
            key_cache, value_cache = entry
            if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
                raise ValueError("layout='cuda' takes (key, value) 4-D pairs per layer")
            views.extend((key_cache, value_cache))
        else:
            raise ValueError(f"unknown KV layout {layout!r} (expected 'cpu' or 'cuda')")
    return views


def check_compaction_order(
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    pair_start_loc: torch.Tensor | None = None,
) -> None:
    """Raise ``ValueError`` unless in-order copying within each group is safe.

    Checks: within a group no source equals an earlier pair's destination; no slot is
    the destination of two pairs; no group touches a slot another group writes.
    """
    src = src_slots.tolist()
    dst = dst_slots.tolist()
    if len(src) != len(dst):
        raise ValueError("src_slots and dst_slots differ in length")
    bounds = [0, len(src)] if pair_start_loc is None else pair_start_loc.tolist()
    if len(set(dst)) != len(dst):
        raise ValueError("a destination slot appears twice")
    owner: dict[int, int] = {}
    for g in range(len(bounds) - 1):
        written: set[int] = set()
        for i in range(bounds[g], bounds[g + 1]):
            if src[i] in written:
                raise ValueError(
                    f"pair {i} reads slot {src[i]} after it was overwritten"
                )
            written.add(dst[i])
            for slot in (src[i], dst[i]):
                if owner.setdefault(slot, g) != g:
                    raise ValueError(f"slot {slot} is used by two groups")


def compact_kv_torch(
    kv_caches: KVCaches,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    layout: str = "cpu",
) -> None:
    """PyTorch compaction (reference, and the CPU engine path); in place.

    Gathers every source first, then scatters to the destinations. Under the order
    preconditions (no source is an earlier pair's destination, destinations distinct:
    :func:`check_compaction_order`) this equals copying the pairs one by one in order,
    for any number of requests, in two indexing ops per K/V view.
    """
    views = _slot_major_views(kv_caches, layout)
    keep = src_slots != dst_slots
    if not bool(keep.any()):
        return
    for view in views:
        block_size = view.shape[1]
        src = src_slots[keep].to(view.device, torch.int64)
        dst = dst_slots[keep].to(view.device, torch.int64)
        rows = view[src // block_size, src % block_size]  # advanced indexing copies
        view[dst // block_size, dst % block_size] = rows


@triton.jit
def _compact_kernel(
    base_ptr,  # first view of the launch: fixes the element type
    view_ptrs,  # int64 [num_views]: data_ptr of every K/V view of the launch
    src_ptr,
    dst_ptr,
    pair_start_ptr,
    stride_b,
    stride_s,
    stride_h,
    stride_d,
    block_size,
    num_heads,
    DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    HEADS_PER_PROG: tl.constexpr,
):
    group = tl.program_id(0)
    head_chunk = tl.program_id(1)
    view = tl.program_id(2)
    cache_ptr = tl.load(view_ptrs + view).to(tl.pointer_type(base_ptr.dtype.element_ty))
    lo = tl.load(pair_start_ptr + group)
    hi = tl.load(pair_start_ptr + group + 1)
    heads = head_chunk * HEADS_PER_PROG + tl.arange(0, HEADS_PER_PROG)
    offs_d = tl.arange(0, DIM_PAD)
    inner = heads[:, None].to(tl.int64) * stride_h + offs_d[None, :] * stride_d
    ok = (heads[:, None] < num_heads) & (offs_d[None, :] < DIM)
    # Sequential on purpose: pair i's write may hit an earlier pair's source.
    for i in range(lo, hi):
        src = tl.load(src_ptr + i)
        dst = tl.load(dst_ptr + i)
        if src != dst:
            src_off = (src // block_size) * stride_b + (src % block_size) * stride_s
            dst_off = (dst // block_size) * stride_b + (dst % block_size) * stride_s
            x = tl.load(cache_ptr + src_off + inner, mask=ok)
            tl.store(cache_ptr + dst_off + inner, x, mask=ok)


def _launch_groups(views: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Views that share dtype, shape and strides, in first-seen order.

    One launch serves a whole group through a table of base pointers. vLLM gives
    every layer of a KV-cache group the same shape and strides, so a model is one
    launch (hybrid models with several cache specs: one per spec).
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for view in views:
        key = (view.dtype, view.device, tuple(view.shape), view.stride())
        groups.setdefault(key, []).append(view)
    return list(groups.values())


# Device tables of the views' data pointers, by (device, pointers): an engine's caches never
# move, so each launch group's table is uploaded once, not every step.
_VIEW_POINTERS: dict[tuple, torch.Tensor] = {}


def _view_pointers(views: list[torch.Tensor]) -> torch.Tensor:
    key = (str(views[0].device), *(v.data_ptr() for v in views))
    table = _VIEW_POINTERS.get(key)
    if table is None:
        if len(_VIEW_POINTERS) >= 64:   # caches of engines that are gone
            _VIEW_POINTERS.clear()
        table = _VIEW_POINTERS[key] = torch.tensor(
            key[1:], dtype=torch.int64, device=views[0].device)
    return table


def compact_kv(
    kv_caches: KVCaches,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    pair_start_loc: torch.Tensor | None = None,
    layout: str = "cuda",
    validate: bool = False,
) -> None:
    """Triton compaction over all layers; in place.

    Args:
        kv_caches: per-layer caches in ``layout`` (see module docstring).
        src_slots, dst_slots: int64 ``[num_pairs]`` flat slot ids, on the caches'
            device; pairs of one request contiguous and in increasing order.
        pair_start_loc: int32/int64 ``[num_groups + 1]`` splitting the pairs into
            independent groups (usually one per request) that run in parallel; by
            default all pairs form one sequential group.
        layout: ``"cuda"`` or ``"cpu"``.
        validate: run :func:`check_compaction_order` first (host sync; for tests).
    """
    if src_slots.shape != dst_slots.shape or src_slots.dim() != 1:
        raise ValueError("src_slots and dst_slots must be 1-D and of equal length")
    num_pairs = src_slots.numel()
    if pair_start_loc is None:
        pair_start_loc = torch.tensor([0, num_pairs], device=src_slots.device)
    if validate:
        check_compaction_order(src_slots, dst_slots, pair_start_loc)
    views = _slot_major_views(kv_caches, layout)
    if num_pairs == 0 or not views:
        return
    src = src_slots.to(torch.int64)
    dst = dst_slots.to(torch.int64)
    starts = pair_start_loc.to(torch.int64)
    num_groups = starts.numel() - 1
    # One launch for all layers (per group of identically laid-out views): programs
    # are (pair group, head chunk, view); layers never share slots, so only the pairs
    # inside one (group, view) need the sequential order.
    for launch in _launch_groups(views):
        first = launch[0]
        _, block_size, num_heads, dim = first.shape
        dim_pad = triton.next_power_of_2(dim)
        heads_per_prog = min(triton.next_power_of_2(num_heads), max(1, 4096 // dim_pad))
        ptrs = _view_pointers(launch)
        grid = (num_groups, triton.cdiv(num_heads, heads_per_prog), len(launch))
        _compact_kernel[grid](
            first,
            ptrs,
            src,
            dst,
            starts,
            *first.stride(),
            block_size,
            num_heads,
            DIM=dim,
            DIM_PAD=dim_pad,
            HEADS_PER_PROG=heads_per_prog,
        )
