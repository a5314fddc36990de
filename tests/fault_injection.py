"""Test-only fault injection into PTD's per-step stages, inside the worker process.

Production code carries no hooks: `inject_faults` wraps the stage functions themselves in the
worker (module functions of tree_step, tree_verification and kv_compaction, methods of the PTD
proposer instance), so that the
next `count` calls of a stage raise `InjectedFault`. Once installed, a wrapper with no fault
left passes straight through to the real function.

Stages (what raises, and where PTD must catch it):
- "propose": one request's proposal (`PTDProposer._propose_one`), before anything is drafted.
- "layout": one request's tree setup in `_prepare_inputs` (`tree_step.plan_tree`).
- "attention": the step's tree attention plan (`tree_step.tree_attention_metadata`): every
  request with a masked tree that step is hit.
- "verify": one request's verification (`tree_verification.verify_tree`). The real
  verification runs first, so a seeded request's generator has drawn when it raises.
- "compaction": the step's KV compaction (`kv_compaction.compact_accepted_kv`), after it
  moved the first half of the accepted nodes' KV: every request with moves that step is hit.
- "fallback": the fallback's own bookkeeping: inside the next `count` calls of
  `PTDProposer.fall_back`, dropping the request's state (`forget`) raises. Needs a fault at
  another stage to bring a request to its fallback.

Per-request stages ("propose", "layout", "verify") can be aimed at greedy or at sampled
requests only (`where`); the per-step ones hit every request concerned.

Offline: `llm.collective_rpc(partial(inject_faults, stage="verify", count=3))`; counters
with `llm.collective_rpc(fault_counts)` (keyed "stage" or "stage:where"). From `vllm serve`:
start it with `--worker-extension-cls fault_injection.PTDFaultExtension`,
`VLLM_SERVER_DEV_MODE=1` and this directory on PYTHONPATH, then `POST /collective_rpc` with
`{"method": "ptd_inject_faults", "args": ["verify", "3"]}` or `{"method": "ptd_fault_counts"}`.
"""

from __future__ import annotations

import sys

import cloudpickle

from vllm_ptd.vllm_integration.introspection import PTDWorkerExtension

STAGES = ("propose", "layout", "attention", "verify", "compaction", "fallback")
PER_REQUEST = ("propose", "layout", "verify")
WHERE = (None, "greedy", "sampled")

# Functions of this module travel to the engine process by value (`collective_rpc` pickles
# them), so the engine need not be able to import this test directory.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InjectedFault(RuntimeError):
    pass


def _take(state: dict | None, stage: str, params=None) -> bool:
    """Whether this call of `stage` fails (and counts it); `params`: the request's sampling
    params, for faults aimed at greedy or sampled requests."""
    if state is None:
        return False
    keys = [stage]
    if params is not None:
        keys.append(f"{stage}:{'greedy' if params.temperature < 1e-5 else 'sampled'}")
    for key in keys:
        if state["left"].get(key, 0) > 0:
            state["left"][key] -= 1
            state["fired"][key] = state["fired"].get(key, 0) + 1
            return True
    return False


def _params(runner, req_id):
    req = getattr(runner, "requests", {}).get(req_id)
    return None if req is None else req.sampling_params


def _state_of(runner) -> dict | None:
    return getattr(getattr(runner, "drafter", None), "_test_faults", None)


def _install(drafter) -> dict:
    """Wrap every stage once per worker; returns the fault counters."""
    state = getattr(drafter, "_test_faults", None)
    if state is not None:
        return state
    from vllm_ptd.vllm_integration import kv_compaction, tree_step, tree_verification

    state = {"left": {}, "fired": {}}
    drafter._test_faults = state
    drafter.kv_mirrors._test_faults = state   # the attention plan only sees the mirror store

    propose_one = drafter._propose_one

    def _propose_one(req_id, req_state, *args, **kwargs):
        if _take(state, "propose", req_state.sampling_params):
            raise InjectedFault("propose")
        return propose_one(req_id, req_state, *args, **kwargs)

    drafter._propose_one = _propose_one

    fall_back = drafter.fall_back

    def _fall_back(req_id, stage, error=None):
        if not _take(state, "fallback"):
            return fall_back(req_id, stage, error)

        def forget(*args, **kwargs):
            raise InjectedFault("fallback")

        drafter.forget = forget
        try:
            return fall_back(req_id, stage, error)
        finally:
            del drafter.forget   # the class's method again

    drafter.fall_back = _fall_back

    if not getattr(tree_step.plan_tree, "_ptd_fault_wrapper", False):
        plan_tree, tree_metadata = tree_step.plan_tree, tree_step.tree_attention_metadata
        verify_tree, compact = tree_verification.verify_tree, kv_compaction.compact_accepted_kv

        def plan_tree_(runner, req_id, *args, **kwargs):
            if _take(_state_of(runner), "layout", _params(runner, req_id)):
                raise InjectedFault("layout")
            return plan_tree(runner, req_id, *args, **kwargs)

        def tree_metadata_(blocks, num_scheduled_tokens, kv_mirrors, transfers, **kwargs):
            if _take(getattr(kv_mirrors, "_test_faults", None), "attention"):
                raise InjectedFault("attention")
            return tree_metadata(blocks, num_scheduled_tokens, kv_mirrors, transfers, **kwargs)

        def verify_tree_(runner, req_id, *args, **kwargs):
            result = verify_tree(runner, req_id, *args, **kwargs)
            if _take(_state_of(runner), "verify", _params(runner, req_id)):
                raise InjectedFault("verify")
            return result

        def compact_(runner, pairs, transfers):
            if _take(_state_of(runner), "compaction"):
                half = pairs.shape[1] // 2
                if half:
                    compact(runner, pairs[:, :half], transfers)
                raise InjectedFault("compaction")
            return compact(runner, pairs, transfers)

        for fn in (plan_tree_, tree_metadata_, verify_tree_, compact_):
            fn._ptd_fault_wrapper = True
        tree_step.plan_tree, tree_step.tree_attention_metadata = plan_tree_, tree_metadata_
        tree_verification.verify_tree, kv_compaction.compact_accepted_kv = verify_tree_, compact_
    return state


def _drafter(worker):
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter if isinstance(drafter, PTDProposer) else None


def inject_faults(worker, stage: str, count: int = 1, where: str | None = None) -> bool:
    """Runs inside each worker: the next `count` calls of `stage` raise (added to any left);
    `where` ("greedy" or "sampled", per-request stages only): for such requests only."""
    if stage not in STAGES or where not in WHERE or (where and stage not in PER_REQUEST):
        raise ValueError(f"unknown fault {stage!r}/{where!r}")
    drafter = _drafter(worker)
    if drafter is None:
        return False
    state = _install(drafter)
    key = stage if where is None else f"{stage}:{where}"
    state["left"][key] = state["left"].get(key, 0) + int(count)
    return True


def fault_counts(worker) -> dict | None:
    """Runs inside each worker: {"left": {stage: n}, "fired": {stage: n}}."""
    drafter = _drafter(worker)
    if drafter is None:
        return None
    state = getattr(drafter, "_test_faults", None) or {"left": {}, "fired": {}}
    return {"left": dict(state["left"]), "fired": dict(state["fired"])}


def clear_faults(worker) -> bool:
    """Runs inside each worker: drop the faults not fired yet (wrappers stay, inert)."""
    drafter = _drafter(worker)
    state = getattr(drafter, "_test_faults", None)
    if state is not None:
        state["left"].clear()
    return drafter is not None


class PTDFaultExtension(PTDWorkerExtension):
    """`--worker-extension-cls` for servers under test: PTD's snapshot plus fault injection
    by method name (vLLM's dev endpoint passes string arguments only)."""

    def ptd_inject_faults(self, stage: str, count: str = "1", where: str = "") -> bool:
        return inject_faults(self, stage, int(count), where or None)

    def ptd_fault_counts(self) -> dict | None:
        return fault_counts(self)

    def ptd_clear_faults(self) -> bool:
        return clear_faults(self)
