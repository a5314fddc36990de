"""PTD's CUDA attention path inside the real vLLM 0.32 engine, on CPU.

The engine runs PTD (`draft_shape` "tree", fixed budget, float32) on
`TritonTreeAttentionBackend` (vllm_ptd/attention/triton_tree_backend.py) with its metadata
builder, the step's packed tree masks (tree_step.pack_batch_tree_masks), `StepTransfers`, tree
verification and the Triton KV compaction (kernels/kv_compaction.py), PTD's Triton kernels in
Triton's interpreter (`TRITON_INTERPRET=1`), in place of PTD's CPU backend. Its greedy output
must equal plain greedy decoding by vLLM's stock CPU engine, token for token, for three real
prompts (from three of the prompt sets) of which the second and the third join mid-flight, each while the
requests before it decode; trees must have branched (`masked_blocks`), accepted nodes' KV must
have moved (`kv_moves`, the Triton compaction launched) and joined requests' rows must have
shared tree-kernel launches with other requests' trees. A last request that PTD does not draft
for runs alone: vLLM must take its steps, and no step with a tree, for the uniform decode batch
that FULL CUDA graphs replay (vllm_integration/cuda_graphs.py).

What is substituted, for this test only, and why (all of it in
tests/cuda_backend_engine.py `install_substitutions`):
(a) vLLM's CPU platform's attention backend choice returns `TritonTreeAttentionBackend`:
    the CPU platform always picks its own backend (and PTD registers the Triton backend on
    CUDA only);
(b) vLLM's KV cache write `triton_reshape_and_cache_flash` is a PyTorch scatter into the same
    cache views, and
(c) vLLM's `unified_attention`, which the backend runs on steps without tree metadata
    (prefills, steps without branching trees), is causal attention in PyTorch over the same
    paged cache:
    vLLM's CPU build finds no Triton CPU backend (`HAS_TRITON` False), so its own Triton
    kernels are placeholders there.
PTD's code runs unmodified; its kernels are wrapped only to count their launches.

Each engine runs in a fresh interpreter (tests/cuda_backend_engine.py), so that
`TRITON_INTERPRET` is set before anything imports Triton, the engine runs in that process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, where the substitutions apply) and nothing of them leaks
into other tests. The model is the embedded model, all 30 layers: a model cut to a few layers
repeats a few tokens, a weak check of masks and KV. With these prompts, skipping the KV
compaction or attending tree rows causally instead of through their masks changes one of the
three outputs (checked by hand). 24 new tokens per request keep the interpreted kernels near
2.5 minutes an engine on two idle cores. A third engine runs `draft_shape` "auto" the same way.
The interpreted kernels run mostly on one core, so the engines run in two lanes at once, each
bound to its half of the cores (vLLM's `VLLM_CPU_OMP_THREADS_BIND`): measured on a 2-core Xeon,
alone the tree engine took 141 s, the auto engine 114 s and the plain one 43 s; in two lanes
the tree and auto engines took 176 s together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

LAYERS = 30   # the embedded model's attention layers: one tree-kernel launch each per step
DRIVER = Path(__file__).with_name("cuda_backend_engine.py")


def run_engine(mode: str, model: str, out_dir: Path, cores: str | None = None) -> dict:
    out = out_dir / f"{mode}.json"
    env = dict(os.environ, **({"VLLM_CPU_OMP_THREADS_BIND": cores} if cores else {}))
    proc = subprocess.run([sys.executable, str(DRIVER), mode, model, str(out)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0 and out.is_file(), (
        f"{mode} engine failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n"
        f"{proc.stderr[-8000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vllm_ptd.model import default_model_path

    tmp = tmp_path_factory.mktemp("cuda_backend_engine")
    model = default_model_path()   # all 30 layers: real text, so wrong masks or KV show
    lanes = _core_lanes()
    if lanes is None:
        return {mode: run_engine(mode, model, tmp) for mode in ("plain", "triton", "triton_auto")}

    def lane(modes: tuple[str, ...], cores: str) -> dict:
        return {mode: run_engine(mode, model, tmp, cores) for mode in modes}

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(lane, ("triton",), lanes[0])
        second = pool.submit(lane, ("triton_auto", "plain"), lanes[1])
        return {**first.result(), **second.result()}


def _core_lanes() -> tuple[str, str] | None:
    """This process's cores split in two halves, as `VLLM_CPU_OMP_THREADS_BIND` lists (None
    with one core: the engines then run one after the other)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return ",".join(map(str, cores[:half])), ",".join(map(str, cores[half:]))


def test_ptd_on_the_triton_backend_equals_plain_greedy_decoding(runs):
    plain, triton = runs["plain"], runs["triton"]
    assert all(len(o) > 0 for o in plain["outputs"])
    for i, (got, want) in enumerate(zip(triton["outputs"], plain["outputs"], strict=True)):
        assert got == want, f"request {i}: first mismatch at token " + str(
            next((t for t, (a, b) in enumerate(zip(got, want)) if a != b),
                 min(len(got), len(want))))


def test_the_engine_ran_ptds_cuda_path(runs):
    triton = runs["triton"]
    worker, calls, snap = triton["worker"], triton["calls"], triton["snapshot"]
    # Every attention layer on PTD's Triton backend, which the step's masks and KV moves
    # follow (packed mask bits, the Triton compaction), on the CPU device.
    assert worker["backends"] == [
        "vllm_ptd.attention.triton_tree_backend.TritonTreeAttentionBackend"]
    assert worker["packed"] is True and worker["device"] == "cpu"
    # Branching trees went through PTD's Triton tree kernel, one launch per layer and step.
    assert snap["masked_blocks"] > 0
    assert calls["tree_kernel"] > 0 and calls["tree_kernel"] % LAYERS == 0
    # Accepted nodes off the first DFS path moved their KV, through the Triton compaction.
    assert snap["kv_moves"] > 0
    assert calls["compact_kernel"] > 0 and calls["compact_pairs"] >= snap["kv_moves"]
    assert snap["fallbacks"] == 0
    assert snap["transfers"]["uploads"] > 0
    # vLLM's KV writes and the steps without trees ran through the substitutes.
    assert calls["kv_writes"] > 0 and calls["plain_attention"] > 0


def test_only_steps_without_drafts_are_the_batches_full_cuda_graphs_replay(runs):
    # vllm_integration/cuda_graphs.py: one token per request is a PTD engine's uniform
    # decode batch, the only one vLLM replays FULL graphs over (captured without trees). On
    # CPU no graph runs; vLLM's own classification of each step is what is checked.
    triton = runs["triton"]
    worker, steps = triton["worker"], triton["steps"]
    assert worker["uniform_decode_query_len"] == 1
    assert worker["dispatcher_uniform_decode_query_len"] == 1
    assert steps["with_tree"] > 0
    assert steps["uniform_with_tree"] == 0, steps
    # The last request gets no drafts (it asks for logprobs in a processed mode) and runs
    # alone: its decode steps are uniform decode batches, and its output is plain decoding's.
    assert steps["uniform"] > 0, steps
    assert triton["undrafted"] == runs["plain"]["undrafted"]
    assert len(triton["undrafted"]) > 1


def test_requests_joined_mid_flight_and_shared_tree_steps(runs):
    triton = runs["triton"]
    joins, calls = triton["joins"], triton["calls"]
    assert len(joins) == 2
    for i, join in enumerate(joins):
        # Request i was still decoding when request i+1 was added.
        assert f"req{i}" in join["running"], join
    # The first request had run trees before the second one joined, and trees kept running.
    assert joins[0]["snapshot"]["masked_blocks"] > 0
    assert triton["snapshot"]["masked_blocks"] > joins[-1]["snapshot"]["masked_blocks"]
    # Some tree-kernel launches held rows of requests without a tree (a joining request's
    # prefill, or a request decoding plainly) beside the trees, attended causally there.
    assert calls["tree_kernel_mixed"] > 0


def test_auto_mixes_one_requests_tree_with_other_requests_chains_exactly(runs):
    # draft_shape "auto" explores the shape it does not prefer on one drafting request of a
    # step (here after every step without it), so a step's tree-kernel launch can hold that
    # request's tree beside other requests' chains, attended causally: the output must
    # still be plain decoding's.
    plain, auto = runs["plain"], runs["triton_auto"]
    assert auto["outputs"] == plain["outputs"]
    snap = auto["snapshot"]
    assert snap["tree_steps"] > 0 and snap["chain_steps"] > 0 and snap["masked_blocks"] > 0
    assert auto["calls"]["tree_kernel_mixed"] > 0
    assert snap["fallbacks"] == 0
