"""vLLM-free end to end: PTD on a paged KV cache equals plain greedy decoding (float32).

A small random-weight Llama-style model (``tests/llama_tiny.py``: RoPE, GQA, RMSNorm,
SwiGLU, plain PyTorch) keeps its K/V in one buffer carved into per-layer views in
vLLM's ``LBNHC`` / ``BLNHC`` orders, addressed through a shuffled block table. PTD's
core (``PTDRequestState``, ``verify_greedy``) drafts the trees; each step runs with tree
positions, packed masks (``kernels.pack_tree_masks``), the Triton tree-attention kernel
over the paged cache, a device argmax, and the Triton KV compaction of accepted rows.

Asserted: the generated tokens equal plain greedy decoding of the same model (whole
sequence recomputed with causal attention in plain matmuls, no cache) and plain greedy on the paged path;
branching trees ran, tokens were accepted and K/V rows moved; skipping the moves
changes the output (the compaction is load-bearing). A mixed batch (two PTD requests
and a plain one) runs one attention launch per layer and one compaction per step, each
request equal to its own plain greedy output. Compiled on a GPU with a larger
model; through Triton's interpreter on CPU with a tiny one.
"""

import os

import pytest
import torch
from kernel_imports import DEVICE
from llama_tiny import (
    PagedBatchRunner,
    PagedTreeRunner,
    TinyConfig,
    TinyLlama,
    generate_batch_paged,
    generate_ptd_paged,
    greedy_dense,
    greedy_paged,
)

from vllm_ptd.config import PTDConfig

# PTD_E2E_SIZE=large|small overrides the choice by device (e.g. the large model
# through the interpreter, to check its counters on CPU).
if os.environ.get("PTD_E2E_SIZE", "large" if DEVICE == "cuda" else "small") == "large":
    CFG = TinyConfig(vocab=512, hidden=256, num_layers=4, q_heads=8, kv_heads=2, head=64, ffn=512)
    MAX_NEW = 96
else:  # interpreter: every launch is slow, keep it tiny
    CFG = TinyConfig()
    MAX_NEW = 40
PROMPT_LEN = 12


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return TinyLlama(CFG, DEVICE)


MIN_MARGIN = 1e-3  # logit gap on the greedy path, far above float32 rounding (~1e-6)


@pytest.fixture(scope="module")
def prompt_and_greedy(model: TinyLlama) -> tuple[list[int], list[int]]:
    """A random prompt whose greedy continuation has no near-tie at any step (so the
    paged kernels' rounding cannot flip an argmax), and that continuation."""
    return well_separated(model, range(1, 9))


def well_separated(model: TinyLlama, seeds) -> tuple[list[int], list[int]]:
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, CFG.vocab, (PROMPT_LEN,), generator=gen).tolist()
        margins: list[float] = []
        greedy = greedy_dense(model, prompt, MAX_NEW, margins)
        if min(margins) > MIN_MARGIN:
            return prompt, greedy
    pytest.fail("no prompt with a well-separated greedy path")


@pytest.fixture(scope="module")
def prompt(prompt_and_greedy) -> list[int]:
    return prompt_and_greedy[0]


@pytest.fixture(scope="module")
def greedy(prompt_and_greedy) -> list[int]:
    return prompt_and_greedy[1]


def test_paged_plain_greedy_matches_dense(model, prompt, greedy) -> None:
    runner = PagedTreeRunner(model, PROMPT_LEN + MAX_NEW + 80)
    assert greedy_paged(runner, prompt, MAX_NEW) == greedy
    assert runner.counters.kv_moves == 0


@pytest.mark.parametrize("order", ["LBNHC", "BLNHC"])
def test_ptd_trees_on_paged_cache_equal_plain_greedy(model, prompt, greedy, order) -> None:
    runner = PagedTreeRunner(model, PROMPT_LEN + MAX_NEW + 80, order=order, seed=3)
    out = generate_ptd_paged(runner, prompt, MAX_NEW, PTDConfig())
    c = runner.counters
    print(
        f"\n{order}: {c.steps} steps for {len(out)} tokens, {c.branching_steps} branching "
        f"trees, {c.accepted} accepted drafts, {c.kv_moves} KV moves in "
        f"{c.compactions} compactions, up to {c.max_nodes} nodes"
    )
    assert out[:MAX_NEW] == greedy
    assert c.branching_steps > 0, "no branching tree ran"
    assert c.accepted > 0, "no draft was accepted"
    assert c.kv_moves > 0 and c.compactions > 0, "no K/V row moved"
    assert c.max_nodes > 32, "masks of one word only"
    assert c.steps < len(out)


class NoMoveRunner(PagedTreeRunner):
    """Forgets the compaction's moves (keeps the bookkeeping): a broken engine."""

    def compact(self, num_new: int, keep: list[int]) -> int:
        self.length = self.length - num_new + len(keep)
        return 0


def test_skipping_the_kv_moves_changes_the_output(model, prompt, greedy) -> None:
    runner = NoMoveRunner(model, PROMPT_LEN + MAX_NEW + 80, seed=3)
    out = generate_ptd_paged(runner, prompt, MAX_NEW, PTDConfig())
    assert out[:MAX_NEW] != greedy


# Split-KV end to end on the GPU only (2 more minutes through the interpreter; the kernel
# tests force slices on CPU too).
@pytest.mark.parametrize("kv_splits", [None, 3] if DEVICE == "cuda" else [None])
def test_mixed_batch_one_launch_per_layer_equals_plain_greedy(
    model, prompt, greedy, kv_splits
) -> None:
    """Two PTD requests and a plain one in every step (one attention launch per layer
    for the whole batch, ``is_tree`` 1/1/0; one compaction launch for all requests),
    on a block-major buffer whose blocks the requests own interleaved; also with each
    prefix cut into 3 split-KV slices."""
    prompt2, greedy2 = well_separated(model, range(11, 19))
    runner = PagedBatchRunner(
        model, 3, PROMPT_LEN + 8 * MAX_NEW + 80, order="BLNHC", seed=5, kv_splits=kv_splits
    )
    outs = generate_batch_paged(
        runner, [prompt, prompt2, prompt], [True, True, False], MAX_NEW, PTDConfig()
    )
    c = runner.counters
    print(
        f"\nbatch: {c.steps} steps, {c.branching_steps} branching trees, {c.accepted} "
        f"accepted drafts, {c.kv_moves} KV moves in {c.compactions} compactions"
    )
    assert outs == [greedy, greedy2, greedy]
    assert c.branching_steps > 0 and c.accepted > 0 and c.kv_moves > 0
