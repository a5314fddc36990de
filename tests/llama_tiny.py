"""A small random-weight Llama-style model in plain PyTorch, on a paged KV cache, driven
by PTD trees through the project's kernels. No vLLM, no transformers.

Model: token embedding, ``num_layers`` blocks of (RMSNorm, attention with RoPE and GQA,
RMSNorm, SwiGLU MLP), a final RMSNorm and an untied LM head. Two ways to run it:

* :meth:`TinyLlama.dense_logits`: the whole sequence at once, causal softmax attention
  in plain matmuls, no cache;
  :func:`greedy_dense` decodes greedily with it (the plain-greedy oracle).
* :class:`PagedBatchRunner`: the engine-style path, several requests in one launch per
  layer (:class:`PagedTreeRunner` is a batch of one). K/V live in one buffer carved into
  per-layer views the way vLLM 0.32 allocates them (``LBNHC`` or ``BLNHC`` order,
  logical ``[blocks, kv_heads, block_size, 2 * head]``, K/V as the backend's strided
  split), addressed through a shuffled block table. A forward writes the blocks' K/V
  at their slots, then runs ``kernels.tree_attention`` with PTD's packed masks
  (``kernels.pack_tree_masks``) and tree positions (``prefix + depth``) for RoPE;
  ``compact`` moves the accepted rows' K/V with ``kernels.compact_kv`` (all layers and
  requests, one launch) and counts the moves.

:func:`generate_batch_paged` is PTD's loop (``PTDRequestState.propose`` /
``verify_greedy`` / ``observe``, as in ``vllm_ptd/core/driver.py``) over the paged
runner, with the argmax taken on the device and read back in one transfer per step;
:func:`generate_ptd_paged` runs it for one request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from kernel_imports import kernels

from vllm_ptd.config import PTDConfig
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.verify import verify_greedy


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 96
    hidden: int = 64
    num_layers: int = 2
    q_heads: int = 4
    kv_heads: int = 2
    head: int = 16
    ffn: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6
    seed: int = 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on ``[n, heads, head]`` at integer ``positions`` ``[n]``."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class TinyLlama:
    """Random weights (seeded), float32 by default, on ``device``."""

    def __init__(self, cfg: TinyConfig, device: str, dtype: torch.dtype = torch.float32):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        gen = torch.Generator().manual_seed(cfg.seed)

        def w(*shape: int, scale: float | None = None) -> torch.Tensor:
            s = scale if scale is not None else shape[-1] ** -0.5
            return (torch.randn(*shape, generator=gen) * s).to(device, dtype)

        h, hd = cfg.hidden, cfg.head
        self.embed = w(cfg.vocab, h, scale=1.0)
        self.layers = []
        for _ in range(cfg.num_layers):
            self.layers.append(
                {
                    "ln1": (1 + 0.1 * torch.randn(h, generator=gen)).to(device, dtype),
                    "wq": w(cfg.q_heads * hd, h),
                    "wk": w(cfg.kv_heads * hd, h),
                    "wv": w(cfg.kv_heads * hd, h),
                    "wo": w(h, cfg.q_heads * hd),
                    "ln2": (1 + 0.1 * torch.randn(h, generator=gen)).to(device, dtype),
                    "gate": w(cfg.ffn, h),
                    "up": w(cfg.ffn, h),
                    "down": w(h, cfg.ffn),
                }
            )
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = w(cfg.vocab, h, scale=2.0 * h**-0.5)

    def qkv(self, layer: dict, x: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        hx = rms_norm(x, layer["ln1"], cfg.eps)
        q = (hx @ layer["wq"].T).view(-1, cfg.q_heads, cfg.head)
        k = (hx @ layer["wk"].T).view(-1, cfg.kv_heads, cfg.head)
        v = (hx @ layer["wv"].T).view(-1, cfg.kv_heads, cfg.head)
        return rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta), v

    def finish_layer(self, layer: dict, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn.reshape(x.shape[0], -1) @ layer["wo"].T
        hx = rms_norm(x, layer["ln2"], self.cfg.eps)
        return x + (F.silu(hx @ layer["gate"].T) * (hx @ layer["up"].T)) @ layer["down"].T

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.norm, self.cfg.eps) @ self.lm_head.T

    @torch.inference_mode()
    def dense_logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits ``[n, vocab]`` of a whole sequence: causal attention, no cache."""
        cfg = self.cfg
        ids = torch.tensor(tokens, device=self.device)
        pos = torch.arange(len(tokens), device=self.device)
        x = self.embed[ids]
        group = cfg.q_heads // cfg.kv_heads
        n = len(tokens)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        for layer in self.layers:
            q, k, v = self.qkv(layer, x, pos)
            k = k.repeat_interleave(group, 1)
            v = v.repeat_interleave(group, 1)
            # Plain matmul softmax attention (no fused SDPA kernel whose fp32 path
            # might use other precisions on a GPU).
            scores = torch.einsum("qhd,khd->hqk", q, k) * cfg.head**-0.5
            scores = scores.masked_fill(~causal, float("-inf"))
            o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
            x = self.finish_layer(layer, x, o)
        return self.logits(x)


def greedy_dense(
    model: TinyLlama, prompt: list[int], max_new: int, margins: list[float] | None = None
) -> list[int]:
    """Plain greedy decoding, the whole sequence recomputed each token. ``margins``, if
    given, receives each step's gap between the best and second-best logit (a gap near
    float32 rounding would make any other kernel's argmax a coin flip)."""
    seq, out = list(prompt), []
    for _ in range(max_new):
        logits = model.dense_logits(seq)[-1]
        if margins is not None:
            top2 = logits.topk(2).values
            margins.append(float(top2[0] - top2[1]))
        tok = int(logits.argmax())
        seq.append(tok)
        out.append(tok)
    return out


def carve_kv_buffer(
    order: str,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One buffer, per-layer (K, V) views as vLLM 0.32's Triton backend sees them."""
    if order == "LBNHC":
        raw = torch.zeros(num_layers, num_blocks, block_size, kv_heads, 2 * head)
        raw = raw.to(device, dtype)
        views = [raw[i].permute(0, 2, 1, 3) for i in range(num_layers)]
    elif order == "BLNHC":
        raw = torch.zeros(num_blocks, num_layers, block_size, kv_heads, 2 * head)
        raw = raw.to(device, dtype)
        views = [raw[:, i].permute(0, 2, 1, 3) for i in range(num_layers)]
    else:
        raise ValueError(f"unknown KV order {order!r}")
    kv = [tuple(v.transpose(1, 2).split(head, dim=-1)) for v in views]
    return raw, kv  # type: ignore[return-value]


@dataclass
class Counters:
    steps: int = 0
    tree_steps: int = 0  # layouts that are not a chain
    branching_steps: int = 0  # some node (x included) with two or more children
    kv_moves: int = 0  # compaction pairs with src != dst
    compactions: int = 0  # compaction launches (steps with moves)
    accepted: int = 0
    max_nodes: int = 0


class PagedBatchRunner:
    """Several requests on one paged cache, each step one launch per layer for the whole
    batch (rows of request r at ``query_start_loc[r]``), as in an engine step; tree and
    plain (causal, ``is_tree == 0``) requests mixed. Compaction of every request's
    accepted rows in one ``compact_kv`` call, one pair group per request."""

    def __init__(
        self,
        model: TinyLlama,
        num_reqs: int,
        max_tokens: int,
        block_size: int = 16,
        order: str = "BLNHC",
        seed: int = 0,
        kv_splits: int | None = None,
    ):
        cfg = model.cfg
        self.model, self.block_size, self.num_reqs = model, block_size, num_reqs
        self.kv_splits = kv_splits  # forced split-KV slices (None: the kernel's choice)
        per_req = -(-max_tokens // block_size)
        num_blocks = num_reqs * per_req + 1
        self.raw, self.kv = carve_kv_buffer(order, cfg.num_layers, num_blocks, block_size,
                                            cfg.kv_heads, cfg.head, model.dtype, model.device)
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_blocks, generator=gen)[: num_reqs * per_req]
        self.tables = perm.view(num_reqs, per_req).to(torch.int32)  # interleaved owners
        self.block_table = self.tables.to(model.device)
        self.lengths = [0] * num_reqs
        self.counters = Counters()

    def slots(self, r: int, start: int, n: int) -> torch.Tensor:
        t = torch.arange(start, start + n)
        blocks = self.tables[r].long()[t // self.block_size]
        return blocks * self.block_size + t % self.block_size

    @torch.inference_mode()
    def forward(self, blocks: list[tuple[torch.Tensor, torch.Tensor, list[int] | None]]):
        """``blocks[r] = (tokens, positions, parents or None)`` for every request (an empty
        block is not allowed). Returns per-request logits on the device."""
        model, cfg = self.model, self.model.cfg
        dev = model.device
        lens = [int(tok.shape[0]) for tok, _, _ in blocks]
        tokens = torch.cat([tok for tok, _, _ in blocks]).to(dev)
        positions = torch.cat([pos for _, pos, _ in blocks]).to(dev)
        slots = torch.cat([self.slots(r, self.lengths[r], n) for r, n in enumerate(lens)])
        slots = slots.to(dev)
        blk, off = slots // self.block_size, slots % self.block_size
        parents = [
            p if p is not None else kernels.chain_parents(n) for (_, _, p), n in zip(blocks, lens)
        ]
        mask_bits, words = kernels.pack_tree_masks(parents, dev)
        is_tree = torch.tensor([p is not None for _, _, p in blocks], dtype=torch.int32, device=dev)
        seq_lens = torch.tensor(
            [self.lengths[r] + n for r, n in enumerate(lens)], dtype=torch.int32, device=dev
        )
        qsl = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device=dev)
        x = model.embed[tokens]
        for layer, (key_cache, value_cache) in zip(model.layers, self.kv):
            q, k, v = model.qkv(layer, x, positions)
            key_cache[blk, off] = k
            value_cache[blk, off] = v
            out = torch.empty_like(q)
            kernels.tree_attention(q, key_cache, value_cache, self.block_table, seq_lens, qsl,
                                   mask_bits, words, cfg.head**-0.5, out,
                                   max_query_len=max(lens), is_tree=is_tree,
                                   max_seq_len=max(self.lengths) + max(lens),
                                   num_kv_splits=self.kv_splits)
            x = model.finish_layer(layer, x, out)
        for r, n in enumerate(lens):
            self.lengths[r] += n
        logits = model.logits(x)
        return list(logits.split(lens))

    def compact(self, keeps: list[tuple[int, list[int]]]) -> None:
        """``keeps[r] = (num_new, keep)`` per request; one launch for all requests."""
        src, dst, starts = [], [], [0]
        for r, (num_new, keep) in enumerate(keeps):
            past = self.lengths[r] - num_new
            pairs = [(past + k, past + j) for j, k in enumerate(keep) if k != j]
            if pairs:
                table = self.slots(r, 0, self.lengths[r])
                src += table[[s for s, _ in pairs]].tolist()
                dst += table[[d for _, d in pairs]].tolist()
            starts.append(len(src))
            self.lengths[r] = past + len(keep)
        if src:
            dev = self.model.device
            as_long = {"dtype": torch.int64, "device": dev}
            kernels.compact_kv(self.kv, torch.tensor(src, **as_long),
                               torch.tensor(dst, **as_long), torch.tensor(starts, **as_long),
                               layout="cuda", validate=True)
            self.counters.compactions += 1
            self.counters.kv_moves += len(src)


def generate_batch_paged(
    runner: PagedBatchRunner | _OneRequestBatch,
    prompts: list[list[int]],
    ptd: list[bool],
    max_new: int,
    config: PTDConfig,
) -> list[list[int]]:
    """Requests step together: ``ptd[r]`` drafts trees, the others decode plainly (one
    causal token a step, as plain rows of a PTD step). All prefills run as one batch."""
    c = runner.counters
    n0 = [len(p) - 1 for p in prompts]
    assert all(n0), "prompts need two tokens at least"
    runner.forward([(torch.tensor(p[:-1]), torch.arange(n), None) for p, n in zip(prompts, n0)])
    states = [PTDRequestState(config, p, frozenset()) if d else None for p, d in zip(prompts, ptd)]
    xs = [p[-1] for p in prompts]
    pos = list(n0)
    outs: list[list[int]] = [[] for _ in prompts]
    committed: list[list[int]] = [[] for _ in prompts]
    while any(len(o) < max_new for o in outs):
        layouts, blocks = [], []
        for r, state in enumerate(states):
            if state is None:
                layouts.append(None)
                blocks.append((torch.tensor([xs[r]]), torch.tensor([pos[r]]), None))
                continue
            layout = state.propose(xs[r], committed=committed[r])
            layouts.append(layout)
            blocks.append(
                (
                    torch.from_numpy(layout.tokens),
                    torch.from_numpy(pos[r] + layout.depths.astype(np.int64)),
                    [int(v) for v in layout.parents],
                )
            )
        logits = runner.forward(blocks)
        # One device-to-host transfer for the whole batch's argmax.
        argmax_all = torch.cat([lg.argmax(-1) for lg in logits]).cpu().numpy()
        sizes = [int(lg.shape[0]) for lg in logits]
        argmaxes = np.split(argmax_all, np.cumsum(sizes)[:-1])
        keeps = []
        for r, layout in enumerate(layouts):
            left = max(1, max_new - len(outs[r]))
            if layout is None:
                tokens, accepted = [int(argmaxes[r][0])], []
            else:
                res = verify_greedy(layout, argmaxes[r], frozenset(), left)
                states[r].observe(layout, argmaxes[r], res)
                tokens, accepted = res.tokens, res.accepted
                c.tree_steps += not layout.is_chain
                children = np.bincount(layout.parents[1:] + 1, minlength=len(layout) + 1)
                c.branching_steps += bool((children[1:] > 1).any())
                c.accepted += len(accepted)
                c.max_nodes = max(c.max_nodes, len(layout))
            keeps.append((sizes[r], [0, *accepted]))
            outs[r].extend(tokens)
            pos[r] += 1 + len(accepted)
            xs[r], committed[r] = tokens[-1], tokens
        runner.compact(keeps)
        c.steps += 1
    return [o[:max_new] for o in outs]


class PagedTreeRunner:
    """One request on a paged KV cache: a `PagedBatchRunner` of one, with a one-request
    `forward` and `compact` (what `generate_ptd_paged` and `greedy_paged` drive)."""

    def __init__(self, model: TinyLlama, max_tokens: int, block_size: int = 16,
                 order: str = "LBNHC", seed: int = 0):
        self.batch = PagedBatchRunner(model, 1, max_tokens, block_size, order, seed)
        self.counters = self.batch.counters

    @property
    def length(self) -> int:
        """Tokens with K/V in the cache."""
        return self.batch.lengths[0]

    @length.setter
    def length(self, value: int) -> None:
        self.batch.lengths[0] = value

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                parents: list[int] | None) -> torch.Tensor:
        """Append a block (its K/V written at the next slots) and return its logits
        ``[n, vocab]`` on the device. ``parents`` None: a causal block (prefill)."""
        return self.batch.forward([(tokens, positions, parents)])[0]

    def compact(self, num_new: int, keep: list[int]) -> int:
        """Keep block rows ``keep`` (increasing, ``keep[0] == 0``) of the last ``num_new``
        tokens, moved to the front of the block; returns the number of moved rows."""
        before = self.counters.kv_moves
        self.batch.compact([(num_new, keep)])
        return self.counters.kv_moves - before


class _OneRequestBatch:
    """A `PagedTreeRunner` seen through the batch interface of `generate_batch_paged`, so
    that a subclass's `compact` (a broken engine, in the tests) is what runs."""

    def __init__(self, runner: PagedTreeRunner):
        self.runner, self.counters = runner, runner.counters

    def forward(self, blocks):
        return [self.runner.forward(*blocks[0])]

    def compact(self, keeps) -> None:
        self.runner.compact(*keeps[0])


def generate_ptd_paged(
    runner: PagedTreeRunner, prompt: list[int], max_new: int, config: PTDConfig
) -> list[int]:
    """PTD greedy generation for one request over the paged runner."""
    return generate_batch_paged(_OneRequestBatch(runner), [prompt], [True], max_new, config)[0]


def greedy_paged(runner: PagedTreeRunner, prompt: list[int], max_new: int) -> list[int]:
    """Plain greedy decoding on the paged runner (one-token blocks)."""
    n0 = len(prompt) - 1
    if n0:
        runner.forward(torch.tensor(prompt[:-1]), torch.arange(n0), None)
    x, out = prompt[-1], []
    for i in range(max_new):
        logits = runner.forward(torch.tensor([x]), torch.tensor([n0 + i]), [-1])
        x = int(logits[-1].argmax())
        out.append(x)
    return out
