"""Carry each request's `cache_salt` from vLLM's scheduler to PTD's proposer.

PTD's shared outputs (core/shared_outputs.py) are kept apart per `cache_salt`, vLLM's
per-request isolation key for its prefix cache. vLLM 0.32 keeps the salt on the scheduler's
`Request` only: neither `NewRequestData` (what the scheduler sends the workers) nor the
runner's `CachedRequestState` carries it. Two wrappers bring it across, in PTD engines only:

1. `Scheduler._update_after_schedule` (the end of `Scheduler.schedule`, before the step's
   `SchedulerOutput` goes to the workers): each new request's `NewRequestData` gets a
   `cache_salt` attribute (a plain dataclass: the attribute travels with it, in process or
   pickled to worker processes);
2. `GPUModelRunner.execute_model`: after vLLM made the runner's `CachedRequestState` of a new
   request, the salt is copied onto it, where `PTDProposer` reads it (`_shared_view`). The
   runner keeps that state until the request finishes (preemption and resumption included),
   so the salt stays with the request for its whole life.
"""

from __future__ import annotations


def _is_ptd_scheduler(scheduler) -> bool:
    """Whether this scheduler's engine runs PTD (read only: nothing is written on a plain
    engine's scheduler; the PTD config itself is parsed by `ptd_config_of` elsewhere)."""
    spec = getattr(getattr(scheduler, "vllm_config", None), "speculative_config", None)
    return getattr(spec, "ptd", None) is not None


def make_update_after_schedule(original):
    def _update_after_schedule(self, scheduler_output, *args, **kwargs):
        if not _is_ptd_scheduler(self):
            return original(self, scheduler_output, *args, **kwargs)
        result = original(self, scheduler_output, *args, **kwargs)
        for new in scheduler_output.scheduled_new_reqs:
            salt = getattr(self.requests.get(new.req_id), "cache_salt", None)
            if salt is not None:
                new.cache_salt = salt
        return result

    return _update_after_schedule


def make_execute_model(original):
    def execute_model(self, scheduler_output, *args, **kwargs):
        from vllm_ptd.vllm_integration.proposer import PTDProposer

        if not isinstance(getattr(self, "drafter", None), PTDProposer):
            return original(self, scheduler_output, *args, **kwargs)
        output = original(self, scheduler_output, *args, **kwargs)
        for new in scheduler_output.scheduled_new_reqs:
            salt = getattr(new, "cache_salt", None)
            state = self.requests.get(new.req_id) if salt is not None else None
            if state is not None:
                state.cache_salt = salt
        return output

    return execute_model
