"""Per-step stage times from inside vLLM's model-runner process (a development aid, off by default).

`benchmarks/step_costs.py` times a step's stages by wrapping vLLM's functions in its own
process, so it can only time in-process engine cores. vLLM's default multiprocess engine (what
`vllm serve` and `LLM` run) executes the model in a worker process, where on a 2-core CPU it
runs on one core beside the engine core and the front end on the other, and a draft row costs
about twice what it costs in-process. With `VLLM_PTD_STAGE_TRACE=PREFIX` set, every process
that loads the plugin and runs a model runner appends one JSON line per step to
`PREFIX.<pid>.jsonl`: the speculative method, scheduled tokens, requests, draft rows, the
period since the previous step began and the milliseconds of each stage below (vLLM 0.32's
runner: `execute_model` runs the forward and the logits, `sample_tokens` samples, verifies and
proposes). `benchmarks/stage_trace_report.py` tabulates the files by method and draft rows.

Every engine of any method is traced (plain included): the wrappers are installed on vLLM's
runner class before any engine is built, and cost two clock reads per wrapped call.
"""

from __future__ import annotations

import json
import os
import time

TRACE_ENV = "VLLM_PTD_STAGE_TRACE"
# (attribute of GPUModelRunner or "logits" for LogitsProcessor.forward, stage name)
STAGES = (("_prepare_inputs", "inputs"), ("_model_forward", "forward"), ("logits", "logits"),
          ("_sample", "sample"), ("propose_draft_token_ids", "propose"),
          ("sample_tokens", "sample_tokens"))

_installed = False


def install_from_env() -> bool:
    """Install the tracer in this process when `VLLM_PTD_STAGE_TRACE` is set (once)."""
    global _installed
    prefix = os.environ.get(TRACE_ENV)
    if not prefix or _installed:
        return False
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _installed = True
    install(f"{prefix}.{os.getpid()}.jsonl", GPUModelRunner, LogitsProcessor)
    return True


def install(path: str, runner_cls, logits_cls) -> None:
    """Wrap `runner_cls`'s stages (vLLM's GPUModelRunner) and `logits_cls.forward`; each
    step's record is written when the next step begins."""
    stage_seconds: dict[str, float] = {}
    step: dict = {}
    out = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered, open for the process's life)

    def timed(original, stage):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                stage_seconds[stage] = (stage_seconds.get(stage, 0.0)
                                        + time.perf_counter() - start)
        return wrapper

    for attribute, stage in STAGES:
        owner, name = ((logits_cls, "forward") if attribute == "logits"
                       else (runner_cls, attribute))
        setattr(owner, name, timed(getattr(owner, name), stage))

    execute_model = runner_cls.execute_model

    def traced_execute_model(self, scheduler_output, *args, **kwargs):
        now = time.perf_counter()
        if step:   # the previous step ends where this one begins
            record = {**step, "period_ms": 1e3 * (now - step.pop("start")),
                      **{k: 1e3 * v for k, v in stage_seconds.items()}}
            out.write(json.dumps(record) + "\n")
        stage_seconds.clear()
        spec = scheduler_output.scheduled_spec_decode_tokens
        step.update(start=now, method=_method(self),
                    tokens=scheduler_output.total_num_scheduled_tokens,
                    requests=len(scheduler_output.num_scheduled_tokens),
                    draft_rows=sum(map(len, spec.values())))
        return execute_model(self, scheduler_output, *args, **kwargs)

    runner_cls.execute_model = traced_execute_model


def _method(runner) -> str:
    """The runner's speculative method; PTD runs through vLLM's custom_class path."""
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and type(drafter).__module__.startswith("vllm_ptd"):
        return "ptd"
    config = getattr(runner, "speculative_config", None)
    return getattr(config, "method", None) or "plain"
