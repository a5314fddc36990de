"""Every place vllm-ptd touches vLLM internals, in one list.

Each entry names the vLLM attribute, why it is patched, and the factory that wraps it. The
whole list is applied once per process, all or nothing, by `vllm_ptd.plugin.register()`, after
the guard (`vllm_ptd.version_check`) found every patched function as recorded for the installed
vLLM release (`vllm_ptd.vllm_fingerprints.WRAPPED` lists the same functions). Each wrapper
returns straight to vLLM's function for engines that do not run PTD. Not listed: the
development tracer (`stage_trace.py`), which times the runner's stages only when
`VLLM_PTD_STAGE_TRACE` is set and changes no result.
"""

from __future__ import annotations

from vllm_ptd.patching import Patch, apply_together
from vllm_ptd.vllm_integration import (
    cuda_graphs,
    metrics,
    runner_patches,
    sampling_patches,
    spec_config,
    tenants,
)

_RUNNER = "vllm.v1.worker.gpu_model_runner"  # CPUModelRunner subclasses GPUModelRunner

ALL_PATCHES: list[Patch] = [
    Patch(
        module="vllm.engine.arg_utils",
        owner="EngineArgs",
        attr="create_speculative_config",
        make=spec_config.make_create_speculative_config,
        why="accept method 'ptd' with PTD's own keys; map it onto vLLM's custom_class path",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_update_states",
        make=runner_patches.make_update_states,
        why="free PTD per-request state on finish, abort, preemption and resume",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_prepare_inputs",
        make=runner_patches.make_prepare_inputs,
        why="build the step's trees: tree positions (after the slot mapping) and masks",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_build_attention_metadata",
        make=runner_patches.make_build_attention_metadata,
        why="carry the step's tree attention on each layer's attention metadata to PTD's "
            "backends",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_sample",
        make=runner_patches.make_sample,
        why="tree verification replaces the linear rejection sampler; KV compaction",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_input_fits_in_drafter",
        make=runner_patches.make_input_fits_in_drafter,
        why="keep drafting when a sequence nears max_model_len: PTD bounds each tree itself; "
            "vLLM's batch-wide check would schedule zeros in place of every request's tree",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="_check_and_update_cudagraph_mode",
        make=cuda_graphs.make_check_and_update_cudagraph_mode,
        why="CUDA graphs: a PTD engine's uniform decode batch is one token per request, so "
            "steps without drafts keep vLLM's FULL graphs and steps with trees run piecewise "
            "(vLLM's 1 + num_speculative_tokens would drop FULL graphs for every step)",
    ),
    Patch(
        module=_RUNNER,
        owner="",
        attr="build_logitsprocs",
        make=sampling_patches.make_build_logitsprocs,
        why="keep vLLM's min_p and logit-bias processors in PTD engines (vLLM drops them "
            "under any speculative method)",
    ),
    Patch(
        module="vllm.sampling_params",
        owner="SamplingParams",
        attr="_validate_spec_decode",
        make=sampling_patches.make_validate_spec_decode,
        why="accept min_p and logit_bias requests in PTD engines (served exactly)",
    ),
    Patch(
        module="vllm.v1.core.sched.scheduler",
        owner="Scheduler",
        attr="_update_after_schedule",
        make=tenants.make_update_after_schedule,
        why="carry each new request's cache_salt to the workers (on its NewRequestData): "
            "shared outputs are kept apart per salt",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="execute_model",
        make=tenants.make_execute_model,
        why="put the cache_salt on the runner's CachedRequestState, where the proposer "
            "picks the request's own tenant of shared outputs",
    ),
    Patch(
        module=_RUNNER,
        owner="GPUModelRunner",
        attr="sample_tokens",
        make=metrics.make_sample_tokens,
        why="metrics: the step's tree depths and PTD's counters ride on ModelRunnerOutput",
    ),
    Patch(
        module="vllm.v1.core.sched.scheduler",
        owner="Scheduler",
        attr="update_from_output",
        make=metrics.make_update_from_output,
        why="metrics: PTD's counters ride in the step's SchedulerStats to the front end",
    ),
    Patch(
        module="vllm.v1.core.sched.scheduler",
        owner="Scheduler",
        attr="make_spec_decoding_stats",
        make=metrics.make_make_spec_decoding_stats,
        why="metrics: a tree's draft tokens are the rows on its longest path (its depth), "
            "not all its rows, so vLLM's acceptance rate reads right for trees",
    ),
    Patch(
        module="vllm.v1.metrics.loggers",
        owner="StatLoggerManager",
        attr="__init__",
        make=metrics.make_manager_init,
        why="metrics: create PTD's Prometheus metrics next to vLLM's in PTD front ends",
    ),
    Patch(
        module="vllm.v1.metrics.loggers",
        owner="StatLoggerManager",
        attr="record",
        make=metrics.make_manager_record,
        why="metrics: take PTD's counters out of the stats before vLLM's loggers see them; "
            "update PTD's Prometheus metrics",
    ),
]

# Attention backends replaced through vLLM's public registry (not monkey-patching): the PTD
# backends behave exactly like vLLM's when a step carries no tree.
CPU_BACKEND_OVERRIDES = {
    "CPU_ATTN": "vllm_ptd.vllm_integration.cpu_tree_attention.CPUTreeAttentionBackend",
}
CUDA_BACKEND_OVERRIDES = {
    "TRITON_ATTN": "vllm_ptd.attention.triton_tree_backend.TritonTreeAttentionBackend",
}


def _register_backends() -> None:
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if current_platform.is_cpu():
        overrides = CPU_BACKEND_OVERRIDES
    elif current_platform.is_cuda():
        overrides = CUDA_BACKEND_OVERRIDES
    else:
        return
    for name, path in overrides.items():
        register_backend(AttentionBackendEnum[name], path)


def apply_all() -> None:
    apply_together(ALL_PATCHES)
    try:
        _register_backends()
    except BaseException:
        for patch in reversed(ALL_PATCHES):
            patch.revert()
        raise
