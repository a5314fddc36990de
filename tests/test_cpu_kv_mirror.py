"""CPU tree attention through per-request KV mirrors, step after step, against a float64
dense reference over what the paged cache really holds (packed by vLLM's own CPU writer).

Between steps the simulation does what the engine does to a request's cache: positions past
x get new values (accepted nodes compacted into place, plain steps without a tree, a jump of
many tokens), tree rows are written speculatively and later overwritten. A mirror that kept a
stale position, missed a refresh or mixed layers fails the comparison."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tree_attention_reference import dense_tree_attention, random_layout

from vllm_ptd.attention.tree_metadata import TreeAttentionMetadata, TreeBlock
from vllm_ptd.cpu_features import cpu_has_any_flag
from vllm_ptd.vllm_integration import cpu_kv_mirror
from vllm_ptd.vllm_integration import cpu_tree_attention as cta
from vllm_ptd.vllm_integration.cpu_kv_layout import write_kv
from vllm_ptd.vllm_integration.cpu_kv_mirror import (
    EXTEND_KERNEL_CPU_FLAGS,
    KVMirrorStore,
    mirrored_attention,
)

KV_HEADS, GROUP, HEAD_SIZE, NUM_BLOCKS, LAYERS = 3, 3, 64, 48, ("l0", "l1")


class Request:
    """One request's cache contents in two layers, and where its rows sit in the batch."""

    def __init__(self, block_table_row, block_size, dtype, gen):
        self.row = block_table_row
        self.block_size, self.dtype, self.gen = block_size, dtype, gen
        self.truth = {name: (torch.zeros(0, KV_HEADS, HEAD_SIZE, dtype=dtype),) * 2
                      for name in LAYERS}

    def write(self, caches, isa, begin, end) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """New K/V at positions [begin, end) in every layer; returns them per layer."""
        pos = torch.arange(begin, end)
        slots = self.row[pos // self.block_size].long() * self.block_size + pos % self.block_size
        new = {}
        for name in LAYERS:
            k = torch.randn(end - begin, KV_HEADS, HEAD_SIZE, generator=self.gen).to(self.dtype)
            v = torch.randn(end - begin, KV_HEADS, HEAD_SIZE, generator=self.gen).to(self.dtype)
            write_kv(caches[name], k, v, slots, isa)
            keys, values = self.truth[name]
            size = max(end, keys.shape[0])
            grown = [torch.zeros(size, KV_HEADS, HEAD_SIZE, dtype=self.dtype) for _ in (0, 1)]
            grown[0][: keys.shape[0]], grown[1][: values.shape[0]] = keys, values
            grown[0][begin:end], grown[1][begin:end] = k, v
            self.truth[name] = (grown[0], grown[1])
            new[name] = (k, v)
        return new


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("limit_bytes", [None, 1])   # 1: no room, every block gathers
# fused: query, key and value are views of one qkv projection output, as vLLM's decoder
# layers pass them (the mirror then writes K and V rows in one copy); else separate tensors.
@pytest.mark.parametrize("fused", [False, True])
def test_mirrored_tree_attention_stays_exact_over_steps(dtype, block_size, limit_bytes, fused,
                                                       monkeypatch):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    # bf16 blocks with their own K/V run vLLM's extend kernel on CPUs with bf16 dot
    # products; fp16 and float32 never do (fp16 came out wrong on one CPU): count its calls.
    kernel_calls = []
    through_kernel = cpu_kv_mirror._extend_attention
    monkeypatch.setattr(cpu_kv_mirror, "_extend_attention",
                        lambda *a, **k: kernel_calls.append(through_kernel(*a, **k))
                        or kernel_calls[-1])
    monkeypatch.setattr(cpu_kv_mirror, "_EXTEND_KERNEL", None)   # no earlier refusal

    gen = torch.Generator().manual_seed(block_size)
    rng = np.random.default_rng(block_size)
    isa = _get_attn_isa(dtype, block_size, HEAD_SIZE, "auto")
    # Unwritten slots hold large finite garbage: any of it leaking into a row shows.
    caches = {name: (torch.randn(NUM_BLOCKS, KV_HEADS, block_size, 2 * HEAD_SIZE,
                                 generator=gen) * 1e3).to(dtype) for name in LAYERS}
    store = KVMirrorStore(len(LAYERS), **({} if limit_bytes is None
                                          else {"limit_bytes": limit_bytes}))
    max_blocks = -(-700 // block_size)
    perm = torch.randperm(NUM_BLOCKS, generator=gen)
    block_table = torch.zeros(2, max_blocks, dtype=torch.int32)
    block_table[0] = perm[:max_blocks]              # row 0: a plain decode, no tree
    block_table[1] = perm[NUM_BLOCKS - max_blocks:]  # row 1: the tree request
    req = Request(block_table[1], block_size, dtype, gen)
    scale = HEAD_SIZE ** -0.5

    prefix = 200
    req.write(caches, isa, 0, prefix)            # the prompt
    # (advance past x, tree size): accepted nodes, a long stretch of plain steps (150),
    # block boundaries, growth past the first capacity (256), a last one-row block.
    for step, (advance, n) in enumerate([(0, 13), (1, 16), (4, 16), (150, 9), (2, 16),
                                         (1, 5), (7, 16), (120, 16), (3, 1)]):
        if advance:
            # x of the last step is final; what follows it was speculative and is replaced
            # by the accepted (compacted) tokens and any plain steps.
            req.write(caches, isa, prefix + 1, prefix + advance)
            prefix += advance
        tree_rows = req.write(caches, isa, prefix, prefix + n)
        layout = random_layout(n, rng)
        mask = torch.from_numpy(layout.ancestor_mask())
        start = 1                                  # after the plain request's row
        tree = TreeAttentionMetadata(torch.zeros(0, 1, dtype=torch.int32), 1, None,
                                     [TreeBlock(1, start, n, mask, "req")], store)
        attn = SimpleNamespace(seq_lens=torch.tensor([40, prefix + n]), block_table=block_table)
        for name in LAYERS:
            q_width, kv_width = KV_HEADS * GROUP * HEAD_SIZE, KV_HEADS * HEAD_SIZE
            qkv = torch.randn(start + n, q_width + 2 * kv_width, generator=gen).to(dtype)
            query, key, value = qkv.split([q_width, kv_width, kv_width], dim=1)
            if not fused:
                query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
            key[start:] = tree_rows[name][0].reshape(n, -1)
            value[start:] = tree_rows[name][1].reshape(n, -1)
            if fused:   # the views vLLM's Attention layer hands to the backend
                query = query.view(-1, KV_HEADS * GROUP, HEAD_SIZE)
                key = key.view(-1, KV_HEADS, HEAD_SIZE)
                value = value.view(-1, KV_HEADS, HEAD_SIZE)
            output = torch.full((start + n, q_width), float("nan"), dtype=dtype)
            plans = cta._step_plans(tree, attn, caches[name], isa, GROUP)
            assert len(plans.mirrored) == (1 if limit_bytes is None else 0)
            shared = step == 4 and name == "l1"    # a layer without its own K/V inputs
            for blk in plans.mirrored:
                mirrored_attention(name, blk, query, None if shared else key,
                                   None if shared else value, caches[name], output,
                                   plans.layout, scale)
            if plans.gathered is not None:
                rows = cta.tree_attention_rows(query, caches[name], plans.gathered, KV_HEADS,
                                               scale)
                output.index_copy_(0, plans.gathered.out_rows, rows.to(output.dtype))
            keys, values = req.truth[name]
            expected = dense_tree_attention(query[start:].reshape(n, -1), keys[: prefix + n],
                                            values[: prefix + n], mask, GROUP, scale)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(output[start:].double(), expected, atol=tol, rtol=tol)
            assert torch.isnan(output[:start]).all()   # other rows untouched

    if limit_bytes is not None:
        assert len(store) == 0 and not kernel_calls
        return
    # every block with its own K/V (all but one layer of one step) in bf16, none otherwise
    if dtype == torch.bfloat16 and cpu_has_any_flag(*EXTEND_KERNEL_CPU_FLAGS):
        assert sum(kernel_calls) == len(kernel_calls) == 9 * len(LAYERS) - 1
    else:
        assert not kernel_calls
    mirror = store.mirrors["req"]
    assert mirror.capacity >= prefix + 1 and set(mirror.buffers) == set(LAYERS)
    for name in LAYERS:
        valid = mirror.valid[name]
        assert valid == prefix + 1
        buf = mirror.buffers[name]
        keys, values = req.truth[name]
        assert torch.equal(buf[0, :, :valid], keys[:valid].transpose(0, 1))
        assert torch.equal(buf[1, :, :valid], values[:valid].transpose(0, 1))
    store.release("req")
    assert len(store) == 0


def test_the_store_refuses_mirrors_past_its_limit():
    per_token = 2 * KV_HEADS * HEAD_SIZE * 2   # bf16 K and V of one layer
    store = KVMirrorStore(num_layers=30, limit_bytes=30 * per_token * 600)
    first = store.reserve("a", 300, per_token)
    assert first is not None and first.capacity == 512
    first.buffer("l0", KV_HEADS, HEAD_SIZE, torch.bfloat16)
    assert store.reserve("b", 300, per_token) is None        # 512 more tokens do not fit
    assert store.reserve("a", 500, per_token) is first        # fits its capacity already
    store.release("a")
    assert store.reserve("b", 300, per_token) is not None


def test_one_bias_builder_serves_mirrored_and_padded_blocks():
    """`block_bias` padded to the plan's rows and keys is the gathered step plan's bias,
    block by block; unpadded it covers the block's rows and prefix + size keys."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_ptd.vllm_integration.cpu_kv_layout import probe_layout
    from vllm_ptd.vllm_integration.cpu_kv_mirror import block_bias

    rng = np.random.default_rng(3)
    block_size, dtype = 16, torch.float32
    layout = probe_layout(_get_attn_isa(dtype, block_size, HEAD_SIZE, "auto"), dtype,
                          block_size, HEAD_SIZE)
    sizes, prefixes = [5, 9], [20, 3]
    blocks, start = [], 0
    for r, n in enumerate(sizes):
        mask = torch.from_numpy(random_layout(n, rng).ancestor_mask())
        blocks.append(TreeBlock(r, start, n, mask))
        start += n
    seq_lens = torch.tensor([p + n for p, n in zip(prefixes, sizes)])
    block_table = torch.arange(8, dtype=torch.int32).view(2, 4)
    kv_shape = torch.Size([8, KV_HEADS, block_size, 2 * HEAD_SIZE])
    plan = cta.build_step_plan(blocks, seq_lens, block_table, kv_shape, layout, GROUP, None,
                               dtype)
    for b, (blk, prefix) in enumerate(zip(blocks, prefixes)):
        padded = block_bias(blk.mask, prefix, GROUP, dtype, rows=max(sizes), width=plan.keys)
        assert torch.equal(plan.bias[b], padded[0])
    bias = block_bias(blocks[0].mask, prefixes[0], GROUP, dtype)
    assert bias.shape == (1, 1, GROUP * sizes[0], prefixes[0] + sizes[0])
    assert torch.equal(bias[0, 0, : sizes[0], prefixes[0]:] == 0, blocks[0].mask)
