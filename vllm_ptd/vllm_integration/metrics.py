"""PTD on vLLM's Prometheus `/metrics`: spec-decode counters that mean what they say for
trees, and PTD's own figures.

PTD's counters live in the worker (`PTDProposer`); `/metrics` is served by the API server,
another process. They travel on vLLM's own stats path, step by step, in PTD engines only:

1. worker, `GPUModelRunner.sample_tokens`: the step's `ModelRunnerOutput` (a plain
   dataclass, passed as is in process or pickled from a worker process) gets `ptd_report`:
   the depth of every tree verified this step and the proposer's cumulative counters;
2. engine core, `Scheduler.update_from_output`: while vLLM counts the step's drafts,
   `Scheduler.make_spec_decoding_stats` is given the tree's depth as the request's number of
   draft tokens (see below); the counters then ride in the step's `SchedulerStats`, under one
   reserved key of its `kv_connector_stats` dict (a field msgspec carries to the front end);
3. front end, `StatLoggerManager.record`: the reserved key is taken out before any stat
   logger sees the stats (so vLLM's loggers see exactly what they would without PTD) and
   PTD's Prometheus metrics are updated; `StatLoggerManager.__init__` creates them (next to
   vLLM's, in the same registry) when the engine's speculative method is PTD.

What a draft token is for PTD. vLLM counts every scheduled draft row; a PTD tree of 15 rows
of which at most one root-to-leaf path can be accepted would read as a few percent
acceptance. PTD reports instead, per verified tree, its depth: the number of rows on its
longest root-to-leaf path, the most tokens that step could accept. So
`vllm:spec_decode_num_draft_tokens` sums tree depths (for a chain, depth = rows: the same as
vLLM's count), `num_accepted / num_draft_tokens` is the fraction of the reachable depth that
was accepted, and the per-position counters keep their meaning (steps that accepted at least
k+1 tokens). Every row verified is counted by `vllm:ptd_rows` (kind C and T).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_ptd.core.metrics import PTDStats

logger = logging.getLogger("vllm.ptd")

REPORT_KEY = "__vllm_ptd__"   # the reserved key in SchedulerStats.kv_connector_stats

# (name without the "vllm:ptd_" prefix, key in the worker's totals, help text)
COUNTERS = (
    ("steps", "steps", ("Request-steps PTD served (one target pass of one request after its "
     "prefill), drafted or not.")),
    ("drafted_steps", "drafted_steps", "Request-steps that verified drafts."),
    ("tokens", "tokens", ("Tokens committed in PTD's request-steps (accepted drafts and the "
     "bonus token).")),
    ("hit_steps", "hits", "Request-steps whose candidate rows C were non-empty."),
    ("accepted_on_hits", "accepted_on_hits", "Draft tokens accepted on hit steps."),
    ("fallbacks", "fallbacks", "Requests switched to plain decoding after an internal error."),
    ("shared_rows", "shared_rows", ("Chain rows drafted from other requests' finished outputs "
     "(same cache_salt).")),
    ("budget_rows", "budget_rows", ("The per-request row budget summed over batch steps with "
     "drafting requests (mean budget = budget_rows / budget_steps).")),
    ("budget_steps", "budget_steps", "Batch steps with drafting requests."),
)
ROW_KINDS = (("C", "rows_c"), ("T", "rows_t"))


def worker_totals(drafter) -> dict[str, int]:
    """The proposer's cumulative counters, as carried to the front end (ints only)."""
    s, c = drafter.stats, drafter.counters
    shared = drafter.shared
    return {"steps": s.steps, "tokens": s.tokens, "hits": s.hits,
            "accepted_on_hits": s.accepted_on_hits, "rows_c": s.candidate_nodes,
            "rows_t": s.draft_nodes, "drafted_steps": c.drafted_steps,
            "fallbacks": c.fallbacks, "shared_rows": c.shared_rows,
            "budget_rows": c.budget_sum, "budget_steps": c.budget_steps,
            "budget": drafter.step_budget,
            "shared_outputs": 0 if shared is None else shared.num_outputs}


# -- worker ---------------------------------------------------------------------------------
def make_sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        from vllm_ptd.vllm_integration.proposer import PTDProposer

        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, PTDProposer):
            return original(self, *args, **kwargs)
        # This step's trees as run (truncated), held by the proposer from _prepare_inputs
        # (during execute_model) until sampling takes them.
        step = (drafter.step if getattr(self, "execute_model_state", None) is not None
                else None)
        try:
            depths = {} if step is None else step.depths()
        except Exception:
            logger.exception("PTD: reading the step's tree depths failed")
            depths = {}
        output = original(self, *args, **kwargs)
        if type(output) is not ModelRunnerOutput or output is EMPTY_MODEL_RUNNER_OUTPUT:
            return output
        output.ptd_report = {"depths": depths, "totals": worker_totals(drafter)}
        return output

    return sample_tokens


# -- engine core ----------------------------------------------------------------------------
def make_update_from_output(original):
    def update_from_output(self, scheduler_output, model_runner_output):
        report = getattr(model_runner_output, "ptd_report", None)
        if report is None:
            return original(self, scheduler_output, model_runner_output)
        self._ptd_depths = report["depths"]
        try:
            outputs = original(self, scheduler_output, model_runner_output)
        finally:
            self._ptd_depths = None
        for engine_outputs in outputs.values():
            stats = engine_outputs.scheduler_stats
            if stats is not None:
                carried = dict(stats.kv_connector_stats or {})
                carried[REPORT_KEY] = report["totals"]
                stats.kv_connector_stats = carried
        return outputs

    return update_from_output


def make_make_spec_decoding_stats(original):
    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens,
                                 num_accepted_tokens, num_invalid_spec_tokens, request_id):
        depths = getattr(self, "_ptd_depths", None)
        depth = None if depths is None else depths.get(request_id)
        if depth is None:   # not a PTD tree (or not a PTD engine): vLLM's own count
            return original(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                            num_invalid_spec_tokens, request_id)
        # A tree's draft tokens: the rows on its longest root-to-leaf path (module docstring).
        return original(self, spec_decoding_stats, max(depth, num_accepted_tokens),
                        num_accepted_tokens, None, request_id)

    return make_spec_decoding_stats


# -- front end ------------------------------------------------------------------------------
class PTDPrometheus:
    """PTD's Prometheus metrics of one front end, labelled like vLLM's (model_name, engine)."""

    def __init__(self, vllm_config, engine_indexes: list[int]):
        import prometheus_client

        # vLLM's own metrics register in the default registry too (files in multiprocess mode)
        registry = prometheus_client.REGISTRY
        labelnames = ["model_name", "engine"]
        model_name = vllm_config.model_config.served_model_name
        self.labels = {idx: [model_name, str(idx)] for idx in engine_indexes}
        self.last: dict[int, dict[str, int]] = {}
        _unregister(registry)

        def counter(name, doc, extra=()):
            return prometheus_client.Counter(f"vllm:ptd_{name}", doc, [*labelnames, *extra])

        def gauge(name, doc, extra=()):
            return prometheus_client.Gauge(f"vllm:ptd_{name}", doc, [*labelnames, *extra],
                                           multiprocess_mode="mostrecent")

        self.counters = {key: counter(name, doc) for name, key, doc in COUNTERS}
        self.rows = counter("rows", "Draft rows verified, by kind: C (candidates: context "
                            "and pool matches; a chain's rows) and T (draft-tree rows).",
                            ["kind"])
        self.tokens_per_step = gauge("tokens_per_step", "DE: tokens committed per PTD "
                                     "request-step since the engine started.")
        self.hit_rate = gauge("hit_rate", "HR: fraction of request-steps with candidate rows "
                              "C, since the engine started.")
        self.accept_length = gauge("accept_length", "AL: 1 + draft tokens accepted per hit "
                                   "step, since the engine started.")
        self.rows_per_step = gauge("rows_per_step", "Draft rows per request-step by kind (C, "
                                   "T), since the engine started.", ["kind"])
        self.budget = gauge("budget", "Draft rows per drafting request chosen for the latest "
                            "step (the load-adaptive budget, or max_nodes).")
        self._series: dict[int, dict[str, Any]] = {}
        self._counter_keys = [key for _, key, _ in COUNTERS] + [key for _, key in ROW_KINDS]
        for idx in engine_indexes:   # present (at zero) from the start
            self._update(idx, {})

    def _children(self, idx: int) -> dict[str, Any]:
        """The labelled series of one engine, looked up once: `labels()` costs a lock and a
        dict lookup per metric, which on every step of the front end competes with the
        engine core for the CPU."""
        children = self._series.get(idx)
        if children is None:
            labels = self.labels.get(idx) or [next(iter(self.labels.values()))[0], str(idx)]
            children = {key: metric.labels(*labels) for key, metric in self.counters.items()}
            children.update({key: self.rows.labels(*labels, kind) for kind, key in ROW_KINDS})
            children.update(
                tokens_per_step=self.tokens_per_step.labels(*labels),
                hit_rate=self.hit_rate.labels(*labels),
                accept_length=self.accept_length.labels(*labels),
                rows_per_step_C=self.rows_per_step.labels(*labels, "C"),
                rows_per_step_T=self.rows_per_step.labels(*labels, "T"),
                budget=self.budget.labels(*labels))
            self._series[idx] = children
        return children

    def _update(self, idx: int, totals: dict[str, Any]) -> None:
        series = self._children(idx)
        last = self.last.get(idx, {})
        for key in self._counter_keys:
            _advance(series[key], totals.get(key, 0), last.get(key, 0))
        self.last[idx] = dict(totals)
        # The paper's metrics, computed as the worker's own log line computes them.
        stats = PTDStats(steps=totals.get("steps", 0), tokens=totals.get("tokens", 0),
                         hits=totals.get("hits", 0),
                         accepted_on_hits=totals.get("accepted_on_hits", 0),
                         candidate_nodes=totals.get("rows_c", 0),
                         draft_nodes=totals.get("rows_t", 0))
        series["tokens_per_step"].set(stats.DE)
        series["hit_rate"].set(stats.HR)
        series["accept_length"].set(stats.AL)
        series["rows_per_step_C"].set(stats.C_per_step)
        series["rows_per_step_T"].set(stats.T_per_step)
        series["budget"].set(totals.get("budget", 0))

    def record(self, totals: dict[str, Any], engine_idx: int | None) -> None:
        self._update(0 if engine_idx is None else engine_idx, totals)


def _advance(counter, total: int, last: int) -> None:
    """Counters from cumulative totals: add what is new (all of it after an engine restart)."""
    delta = total - last if total >= last else total
    if delta > 0:
        counter.inc(delta)


def _unregister(registry) -> None:
    """Drop PTD collectors of an earlier front end of this process (vLLM does the same for
    its own metrics when it builds a new Prometheus logger)."""
    for collector in list(getattr(registry, "_collector_to_names", {})):
        if getattr(collector, "_name", "").startswith("vllm:ptd_"):
            registry.unregister(collector)


def take_report(scheduler_stats) -> dict[str, Any] | None:
    """Remove PTD's counters from the stats (restoring what vLLM put there) and return them."""
    carried = getattr(scheduler_stats, "kv_connector_stats", None)
    if not carried or REPORT_KEY not in carried:
        return None
    carried = dict(carried)
    totals = carried.pop(REPORT_KEY)
    scheduler_stats.kv_connector_stats = carried or None
    return totals


def make_manager_init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        from vllm_ptd.vllm_integration.spec_config import ptd_config_of

        if ptd_config_of(getattr(vllm_config, "speculative_config", None)) is None:
            return original(self, vllm_config, *args, **kwargs)
        original(self, vllm_config, *args, **kwargs)
        try:
            self._ptd_prometheus = PTDPrometheus(vllm_config, self.engine_indexes)
        except Exception:  # metrics never keep a server from starting
            logger.exception("PTD: creating the Prometheus metrics failed; serving without")
        return None

    return __init__


def make_manager_record(original):
    def record(self, scheduler_stats, iteration_stats, *args, **kwargs):
        prometheus = getattr(self, "_ptd_prometheus", None)
        if prometheus is None or scheduler_stats is None:
            return original(self, scheduler_stats, iteration_stats, *args, **kwargs)
        totals = take_report(scheduler_stats)
        if totals is not None:
            engine_idx = kwargs.get("engine_idx", args[1] if len(args) > 1 else None)
            try:
                prometheus.record(totals, engine_idx)
            except Exception:
                logger.exception("PTD: updating the Prometheus metrics failed")
        return original(self, scheduler_stats, iteration_stats, *args, **kwargs)

    return record
