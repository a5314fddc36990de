"""Which CUDA graphs a PTD engine runs (vllm_integration/cuda_graphs.py), through vLLM's own
graph-mode resolution (`GPUModelRunner._check_and_update_cudagraph_mode`) and its graph
dispatcher (`CudagraphDispatcher`), on a runner carrying only what those read.

With PTD's patch, vLLM's default FULL_AND_PIECEWISE stands: a step in which no request drafted
replays a FULL graph, a step with draft rows runs piecewise (attention eager, where PTD's
backend sees the tree) and no step with a tree is ever the uniform batch a FULL graph was
captured for. Without it, the same engine runs piecewise graphs only. The real engine's steps
are checked against the same rule in tests/test_cuda_backend_in_engine.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import CompilationConfig
from vllm.config.compilation import CompilationMode, CUDAGraphMode
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ptd.attention.triton_tree_backend import TritonTreeAttentionBackend
from vllm_ptd.patching import applied_patches
from vllm_ptd.vllm_integration import cuda_graphs
from vllm_ptd.vllm_integration.proposer import PTDProposer

MAX_NODES = 64        # PTD's CUDA default: vLLM's num_speculative_tokens for PTD engines
MAX_NUM_SEQS = 32
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def vllms_own_check():
    """vLLM's `_check_and_update_cudagraph_mode`, also when the plugin patched it here."""
    for patch in applied_patches():
        if patch.attr == "_check_and_update_cudagraph_mode":
            return patch.original
    return GPUModelRunner._check_and_update_cudagraph_mode


def ptd_runner(mode: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE):
    """What vLLM's graph-mode resolution reads of a runner of a PTD engine on CUDA."""
    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=mode,
                                    cudagraph_capture_sizes=list(CAPTURE_SIZES),
                                    max_cudagraph_capture_size=CAPTURE_SIZES[-1])
    compilation.set_splitting_ops_for_v1("allgather_reducescatter")   # attention splits
    speculative = SimpleNamespace(ptd={"max_nodes": MAX_NODES},
                                  num_speculative_tokens=MAX_NODES, use_eagle=lambda: False,
                                  uses_draft_model=lambda: False,
                                  uses_extract_hidden_states=lambda: False)
    vllm_config = SimpleNamespace(compilation_config=compilation,
                                  speculative_config=speculative,
                                  num_speculative_tokens=MAX_NODES, lora_config=None,
                                  scheduler_config=SimpleNamespace(max_num_seqs=MAX_NUM_SEQS))
    return SimpleNamespace(
        vllm_config=vllm_config, compilation_config=compilation,
        speculative_config=speculative, drafter=PTDProposer.__new__(PTDProposer),
        uniform_decode_query_len=1 + MAX_NODES,   # as vLLM's runner sets it
        kv_cache_config=None, max_num_reqs=MAX_NUM_SEQS,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config))


def resolve(runner, patched: bool) -> CUDAGraphMode:
    check = vllms_own_check()
    if patched:
        check = cuda_graphs.make_check_and_update_cudagraph_mode(check)
    groups = [SimpleNamespace(kv_cache_spec=None)]
    check(runner, [{TritonTreeAttentionBackend}], groups)
    return runner.cudagraph_dispatcher.cudagraph_mode


def graph_for(runner, query_lens: list[int]) -> CUDAGraphMode:
    """The graph vLLM's runner dispatches a step of these per-request query lengths to (its
    `_determine_batch_execution_and_padding`: uniform decode, then the dispatcher)."""
    uniform = GPUModelRunner._is_uniform_decode(
        max_num_scheduled_tokens=max(query_lens),
        uniform_decode_query_len=runner.uniform_decode_query_len,
        num_tokens=sum(query_lens), num_reqs=len(query_lens))
    mode, _ = runner.cudagraph_dispatcher.dispatch(sum(query_lens), uniform_decode=uniform)
    return mode


STEPS = {
    "no request drafted, 1 request": [1],
    "no request drafted, 8 requests": [1] * 8,
    "every request a tree of 15 rows": [16] * 4,
    "one full tree of max_nodes rows (vLLM's uniform length)": [1 + MAX_NODES],
    "trees beside undrafted requests": [1, 1, 6, 1],
}
WITHOUT_DRAFTS = {"no request drafted, 1 request", "no request drafted, 8 requests"}


def test_ptd_engines_keep_full_graphs_for_steps_without_drafts():
    runner = ptd_runner()
    assert resolve(runner, patched=True) == CUDAGraphMode.FULL_AND_PIECEWISE
    assert runner.uniform_decode_query_len == 1
    assert runner.cudagraph_dispatcher.uniform_decode_query_len == 1
    for name, query_lens in STEPS.items():
        want = CUDAGraphMode.FULL if name in WITHOUT_DRAFTS else CUDAGraphMode.PIECEWISE
        assert graph_for(runner, query_lens) == want, name


def test_without_the_patch_vllm_runs_ptd_engines_piecewise_only():
    # What the patch changes: vLLM takes 1 + num_speculative_tokens as the uniform decode
    # length and, for a backend with FULL graphs for one-token decode only, drops FULL graphs.
    runner = ptd_runner()
    assert resolve(runner, patched=False) == CUDAGraphMode.PIECEWISE
    assert graph_for(runner, [1] * 8) == CUDAGraphMode.PIECEWISE


@pytest.mark.parametrize(("mode", "resolved", "with_drafts"), [
    (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.NONE),
    (CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE),
    # FULL for mixed batches needs backends with FULL graphs for any batch: vLLM downgrades.
    (CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE),
])
def test_other_graph_modes_never_replay_a_full_graph_over_a_tree(mode, resolved, with_drafts):
    runner = ptd_runner(mode)
    assert resolve(runner, patched=True) == resolved
    for name, query_lens in STEPS.items():
        got = graph_for(runner, query_lens)
        if name in WITHOUT_DRAFTS:
            assert got == (CUDAGraphMode.PIECEWISE if mode == CUDAGraphMode.PIECEWISE
                           else CUDAGraphMode.FULL), name
        else:
            assert got == with_drafts, name
