"""Tree attention over vLLM's paged KV cache (Triton).

Each request r of the batch brings a query block of ``q_len_r`` tokens (PTD's
``[x; C; T]``) whose K/V the model has already written into the paged cache, at logical
KV indices ``context_len_r + i`` (``context_len_r = seq_len_r - q_len_r``, the committed
prefix), addressed through the block table like any other token. Query row i attends to

* every token of the committed prefix (logical KV ``0 .. context_len_r - 1``), and
* in-block token j iff bit j of its row of ``mask_bits`` is set (j is i or an ancestor
  of i, see :mod:`.tree_mask`).

Visibility never comes from positions: tree positions are ``prefix + depth`` and repeat
between siblings, so only the mask bits decide.

Which rows use this kernel. Steps without any tree (prefill chunks, plain decode)
keep vLLM's ``unified_attention``: it has the split-KV ("3D") path for long decode
contexts, CUDA-graph-friendly scratch, sliding window, ALiBi, sinks and fp8 KV, none of
which PTD needs to re-implement. In a step that has trees, the whole batch goes
through this kernel in one launch: requests flagged non-tree in ``is_tree`` run with a
causal in-block mask computed in the kernel (no mask words needed, so a long prefill
chunk costs no mask memory). One launch avoids splitting a mixed batch, whose rows are
interleaved in ``query``, into two sub-batches. (docs/kernels.md has the long form,
and the CUDA-graph consequence.)

Out of scope (rejected with ``ValueError``, never ignored): sliding window, ALiBi,
logits soft-capping, attention sinks, quantized (fp8/int) KV caches, K/V of different
head sizes, query dtype differing from the cache dtype.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634


def check_supported(
    *,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
) -> None:
    """Raise ``ValueError`` for attention features this kernel does not implement."""
    unsupported = []
    if sliding_window not in (None, -1, 0) and sliding_window != (-1, -1):
        unsupported.append(f"sliding_window={sliding_window}")
    if alibi_slopes is not None:
        unsupported.append("ALiBi")
    if logits_soft_cap not in (None, 0, 0.0):
        unsupported.append(f"logits_soft_cap={logits_soft_cap}")
    if sinks is not None:
        unsupported.append("attention sinks")
    if kv_cache_dtype not in ("auto", "float16", "bfloat16", "float32"):
        unsupported.append(f"kv_cache_dtype={kv_cache_dtype!r}")
    if unsupported:
        raise ValueError(
            "PTD tree attention does not support: " + ", ".join(unsupported)
        )


@triton.jit
def _tree_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_table_ptr,
    seq_lens_ptr,
    qsl_ptr,
    mask_ptr,
    is_tree_ptr,
    part_acc_ptr,  # split-KV partials (NUM_SPLITS > 1): [splits, tokens, q heads, HEAD_PAD]
    part_ml_ptr,  # their running max and sum: [splits, tokens, q heads, 2]
    num_tokens,  # rows of query (partials' token extent)
    num_q_heads,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bt,
    stride_mask,
    block_size,
    NUM_QPK: tl.constexpr,  # query heads per KV head (GQA group)
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per program: BLOCK_Q tokens x NUM_QPK heads
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    HAS_IS_TREE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter only: its bf16 tl.dot is wrong, use fp32
    NUM_SPLITS: tl.constexpr,  # > 1: the prefix is cut into this many slices (split-KV)
):
    req = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + req) - q_len
    tree_flag = 1
    if HAS_IS_TREE:
        tree_flag = tl.load(is_tree_ptr + req)

    offs_m = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + offs_m // NUM_QPK  # in-block index of each row
    head = kv_head * NUM_QPK + offs_m % NUM_QPK
    row_ok = (offs_m < BLOCK_Q * NUM_QPK) & (tok < q_len)
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD
    row = (q_start + tok).to(tl.int64)

    q = tl.load(
        q_ptr
        + row[:, None] * stride_qt
        + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)

    # Pass 0: committed prefix, fully visible. Pass 1: the block's own tokens, up to
    # the last row of this tile (ancestors have smaller indices), visible per mask.
    # Split-KV: each split takes one TILE_N-aligned slice of the prefix; the last split
    # also takes the block's own tokens.
    q_hi = tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)
    slice_len = tl.cdiv(tl.cdiv(ctx_len, NUM_SPLITS), TILE_N) * TILE_N
    for phase in tl.static_range(2):
        if phase == 0:
            lo = split * slice_len
            hi = tl.minimum(lo + slice_len, ctx_len)
        else:
            lo = ctx_len
            hi = ctx_len + tl.where(split == NUM_SPLITS - 1, q_hi, 0)
        for start in range(lo, hi, TILE_N):
            pos = start + tl.arange(0, TILE_N)  # logical KV index
            n_ok = pos < hi
            blk = tl.load(bt_row + pos // block_size, mask=n_ok, other=0).to(tl.int64)
            slot = (pos % block_size).to(tl.int64)
            k = tl.load(
                k_ptr
                + blk[None, :] * stride_kb
                + slot[None, :] * stride_ks
                + kv_head * stride_kh
                + offs_d[:, None] * stride_kd,
                mask=n_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            v = tl.load(
                v_ptr
                + blk[:, None] * stride_vb
                + slot[:, None] * stride_vs
                + kv_head * stride_vh
                + offs_d[None, :] * stride_vd,
                mask=n_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
            vis = row_ok[:, None] & n_ok[None, :]
            if phase == 1:
                col = pos - ctx_len
                # Per-column copy of the request's flag: plain tensors broadcast
                # everywhere (a scalar bool mask trips the interpreter).
                tree = (tl.zeros([TILE_N], dtype=tl.int32) + tree_flag) != 0
                words = tl.load(
                    mask_ptr + row[:, None] * stride_mask + (col // 32)[None, :],
                    mask=vis & tree[None, :],
                    other=0,
                )
                bit = ((words >> (col % 32)[None, :]) & 1) != 0
                if HAS_IS_TREE:
                    causal = col[None, :] <= tok[:, None]
                    vis = vis & tl.where(tree[None, :], bit, causal)
                else:
                    vis = vis & bit
            s = tl.where(vis, s, float("-inf"))

            # Online softmax; rows with nothing visible yet keep m = -inf, so the
            # reference point falls back to 0 to avoid (-inf) - (-inf).
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_ref[:, None])
            alpha = tl.exp2(m_i - m_ref)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(
                p.to(v.dtype), v, input_precision=DOT_PRECISION
            )
            m_i = m_new

    if NUM_SPLITS == 1:
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_i[:, None]
        tl.store(
            out_ptr
            + row[:, None] * stride_ot
            + head[:, None] * stride_oh
            + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        # Unnormalised partials; an empty slice stores m = -inf, l = 0, acc = 0.
        part = (split * num_tokens + row) * num_q_heads + head
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_PAD + offs_d[None, :],
            acc,
            mask=row_ok[:, None],
        )
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qsl_ptr,
    num_reqs,
    num_tokens,
    num_q_heads,
    stride_ot,
    stride_oh,
    stride_od,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """One (token, head) per program: the splits' partial softmaxes combined."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    if row >= tl.load(qsl_ptr + num_reqs):
        return  # a padding row past the batch: left untouched, as without splits
    offs_s = tl.arange(0, SPLITS_PAD)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, HEAD_PAD)
    part = (offs_s.to(tl.int64) * num_tokens + row) * num_q_heads + head
    m = tl.load(part_ml_ptr + part * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(part_ml_ptr + part * 2 + 1, mask=s_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_PAD + offs_d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    m_max = tl.max(m, 0)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_ref)
    total = tl.sum(w * l_s, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(w[:, None] * acc, 0) / total
    tl.store(
        out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD,
    )


# Triton's CPU interpreter multiplies bf16 tiles wrongly (seen with triton 3.9: raw
# bit patterns); under it, bf16 operands are upcast to fp32 before tl.dot.
_INTERPRETED = isinstance(_tree_attention_kernel, InterpretedFunction)


# Split-KV, from timings on an H200 (docs/kernels.md): split only a launch of less than
# one wave of programs (one per SM) over prefixes of 4096+ tokens, into slices of at
# least 1024 tokens, aiming for two programs per SM; below that the second launch and
# the partials cost what the slices save.
_PROGRAMS_PER_SM = 2
_MIN_SPLIT_CONTEXT = 4096
_MIN_SLICE = 1024
_MAX_SPLITS = 32


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_kv_splits(programs: int, max_context: int, sm_count: int) -> int:
    """How many slices to cut each prefix into so ``programs`` fill the GPU.

    A step with few requests and long prefixes otherwise runs a handful of programs,
    each streaming a whole prefix: at batch 1 and 32k tokens, 8 programs on 132 SMs.
    """
    if programs >= sm_count or max_context < _MIN_SPLIT_CONTEXT:
        return 1
    wanted = triton.cdiv(_PROGRAMS_PER_SM * sm_count, programs)
    return max(1, min(_MAX_SPLITS, wanted, max_context // _MIN_SLICE))


def auto_kv_splits(
    num_reqs: int,
    max_query_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    max_seq_len: int,
    device: torch.device,
) -> int:
    """The slice count `tree_attention` picks on a CUDA device when given `max_seq_len`."""
    _, block_q, _ = _tile_sizes(num_q_heads // num_kv_heads, max_query_len, 16)
    programs = num_reqs * triton.cdiv(max_query_len, block_q) * num_kv_heads
    max_context = max_seq_len - 1  # a query block holds at least one token
    return choose_kv_splits(programs, max_context, _sm_count(torch.device(device).index or 0))


def _tile_sizes(num_qpk: int, max_q: int, head_pad: int) -> tuple[int, int, int]:
    """Pick (BLOCK_M, BLOCK_Q, TILE_N). tl.dot needs every dim >= 16."""
    block_m = max(16, triton.next_power_of_2(num_qpk))
    while block_m < 64 and block_m < max_q * num_qpk:
        block_m *= 2
    tile_n = 32 if head_pad <= 128 else 16
    return block_m, block_m // num_qpk, tile_n


def tree_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    mask_bits: torch.Tensor,
    mask_words: int,
    scale: float,
    out: torch.Tensor,
    *,
    max_query_len: int | None = None,
    is_tree: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Tree attention for a batch of query blocks; writes ``out`` and returns it.

    Args:
        query: ``[total_q, num_q_heads, head_size]``; rows of request r are
            ``query_start_loc[r] : query_start_loc[r + 1]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_size]``,
            any strides (vLLM 0.32 hands out strided views of one KV tensor). The
            block's own K/V must already be written at their slots.
        block_table: int32 ``[num_reqs, max_blocks]``; logical KV index t of request r
            lives at block ``block_table[r, t // block_size]``, offset
            ``t % block_size``.
        seq_lens: int32 ``[num_reqs]``, committed prefix + query block length.
        query_start_loc: int32 ``[num_reqs + 1]``, cumulative query lengths.
        mask_bits: int32 ``[>= total_q, mask_words]`` from
            :func:`.tree_mask.pack_tree_masks`; unused rows of non-tree requests
            may hold anything.
        mask_words: words per mask row (row stride of ``mask_bits``).
        scale: softmax scale (usually ``head_size ** -0.5``).
        out: ``[>= total_q, num_q_heads, head_size]``, written for the first
            ``query_start_loc[-1]`` rows only.
        max_query_len: longest query block; computed (one host sync) if omitted.
        is_tree: optional int32/bool ``[num_reqs]``; 0 marks a request whose block is
            a causal chain (prefill chunk, plain decode): its mask rows are not read.
        max_seq_len: longest ``seq_lens`` entry, known on the host (vLLM's metadata
            has it). On CUDA it lets a batch too small to fill the GPU cut long
            prefixes into slices run by programs of their own, merged after
            (split-KV, as vLLM's ``unified_attention`` does for decode). Without it,
            no split (finding it would cost a host sync).
        num_kv_splits: force the number of slices (tests; 1 = never split).
    """
    if query.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported query dtype {query.dtype}")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise ValueError(
            f"KV cache dtype {key_cache.dtype}/{value_cache.dtype} must equal the query "
            f"dtype {query.dtype} (quantized KV caches are not supported)"
        )
    if out.dtype != query.dtype:
        raise ValueError(f"out dtype {out.dtype} != query dtype {query.dtype}")
    if key_cache.shape != value_cache.shape or key_cache.dim() != 4:
        raise ValueError(
            f"key/value caches must both be [num_blocks, block_size, num_kv_heads, "
            f"head_size], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    _, block_size, num_kv_heads, head_size = key_cache.shape
    _, num_q_heads, q_head_size = query.shape
    if q_head_size != head_size or out.shape[1:] != query.shape[1:]:
        raise ValueError("query, out and KV cache head sizes / head counts disagree")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads not a multiple of {num_kv_heads}")
    if mask_bits.dtype != torch.int32 or mask_bits.dim() != 2:
        raise ValueError("mask_bits must be int32 [total_q, mask_words]")
    if mask_bits.shape[1] < mask_words:
        raise ValueError(f"mask_bits has {mask_bits.shape[1]} < {mask_words} words")

    num_reqs = query_start_loc.numel() - 1
    if num_reqs <= 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len > 32 * mask_words and is_tree is None:
        raise ValueError(f"max_query_len {max_query_len} > 32 * mask_words")
    if max_query_len == 0:
        return out

    num_qpk = num_q_heads // num_kv_heads
    head_pad = triton.next_power_of_2(head_size)
    block_m, block_q, tile_n = _tile_sizes(num_qpk, max_query_len, head_pad)
    q_tiles = triton.cdiv(max_query_len, block_q)
    splits = num_kv_splits
    if splits is None:
        splits = 1
        if max_seq_len is not None and query.is_cuda:
            splits = auto_kv_splits(
                num_reqs, max_query_len, num_q_heads, num_kv_heads, max_seq_len, query.device
            )
    if splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {splits}")
    num_tokens = query.shape[0]
    if splits > 1:
        part_acc = torch.empty(
            (splits, num_tokens, num_q_heads, head_pad),
            dtype=torch.float32,
            device=query.device,
        )
        part_ml = torch.empty(
            (splits, num_tokens, num_q_heads, 2), dtype=torch.float32, device=query.device
        )
    else:
        part_acc = part_ml = out  # unused
    grid = (num_reqs, q_tiles, num_kv_heads * splits)
    # fp32 inputs: IEEE dots, so fp32 means fp32 (Triton's default would be tf32).
    precision = "ieee" if query.dtype == torch.float32 else None
    _tree_attention_kernel[grid](
        query,
        key_cache,
        value_cache,
        out,
        block_table,
        seq_lens,
        query_start_loc,
        mask_bits,
        is_tree.to(torch.int32) if is_tree is not None else seq_lens,  # dummy if unused
        part_acc,
        part_ml,
        num_tokens,
        num_q_heads,
        float(scale) * _LOG2E,
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *out.stride(),
        block_table.stride(0),
        mask_bits.stride(0),
        block_size,
        NUM_QPK=num_qpk,
        HEAD=head_size,
        HEAD_PAD=head_pad,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        HAS_IS_TREE=is_tree is not None,
        DOT_PRECISION=precision,
        UPCAST=_INTERPRETED and query.dtype == torch.bfloat16,
        NUM_SPLITS=splits,
    )
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            out,
            part_acc,
            part_ml,
            query_start_loc,
            num_reqs,
            num_tokens,
            num_q_heads,
            *out.stride(),
            HEAD=head_size,
            HEAD_PAD=head_pad,
            NUM_SPLITS=splits,
            SPLITS_PAD=triton.next_power_of_2(splits),
        )
    return out
