"""The development stage tracer (vllm_integration/stage_trace.py) and its report
(benchmarks/stage_trace_report.py), on stand-in classes: one JSON line per step, written when
the next step begins, with the method, tokens, draft rows and every stage's time."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from vllm_ptd.vllm_integration import stage_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import stage_trace_report


class FakeLogits:
    def forward(self):
        time.sleep(0.002)


class FakeRunner:
    def __init__(self, method):
        self.speculative_config = SimpleNamespace(method=method) if method else None
        self.drafter = None
        self.logits = FakeLogits()

    def _prepare_inputs(self):
        pass

    def _model_forward(self):
        time.sleep(0.005)

    def _sample(self):
        pass

    def propose_draft_token_ids(self):
        pass

    def sample_tokens(self):
        self._sample()
        self.propose_draft_token_ids()

    def execute_model(self, scheduler_output):
        self._prepare_inputs()
        self._model_forward()
        self.logits.forward()


def scheduled(drafts: dict[str, list[int]], prompt_tokens: int = 0):
    return SimpleNamespace(
        scheduled_spec_decode_tokens=drafts,
        num_scheduled_tokens=dict.fromkeys(drafts, 1),
        total_num_scheduled_tokens=len(drafts) + sum(map(len, drafts.values())) + prompt_tokens)


def test_one_line_per_step_with_its_stages_and_draft_rows(tmp_path):
    path = tmp_path / "trace.jsonl"
    stage_trace.install(str(path), FakeRunner, FakeLogits)
    runner = FakeRunner("suffix")
    for drafts in ({"a": []}, {"a": [5, 6, 7]}, {"a": [1], "b": []}, {"a": []}):
        runner.execute_model(scheduled(drafts))
        runner.sample_tokens()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # the last step's record waits for a next step that never comes
    assert [r["draft_rows"] for r in lines] == [0, 3, 1]
    assert [r["requests"] for r in lines] == [1, 1, 2]
    assert [r["tokens"] for r in lines] == [1, 4, 3]
    assert {r["method"] for r in lines} == {"suffix"}
    for r in lines:
        assert r["forward"] >= 5.0 and r["logits"] >= 2.0
        assert r["period_ms"] >= r["forward"] + r["logits"]
        assert {"inputs", "sample", "propose", "sample_tokens"} <= set(r)


def test_the_report_keeps_decode_steps_of_the_asked_batch_and_takes_medians():
    steps = [{"method": "ptd", "requests": 1, "tokens": 1 + k, "draft_rows": k,
              "period_ms": 50.0 + 4 * k + j, "forward": 40.0 + 4 * k}
             for k in (0, 2) for j in range(3)]
    steps.append({"method": "ptd", "requests": 1, "tokens": 40, "draft_rows": 0,
                  "period_ms": 500.0, "forward": 400.0})           # a prompt chunk
    steps.append({"method": "ptd", "requests": 2, "tokens": 2, "draft_rows": 0,
                  "period_ms": 60.0, "forward": 45.0})             # another batch size
    rows = stage_trace_report.table(stage_trace_report.decode_steps(steps, requests=1))
    assert [(r["draft_rows"], r["steps"]) for r in rows] == [(0, 3), (2, 3)]
    assert rows[0]["period_ms"] == 51.0 and rows[1]["period_ms"] == 59.0
    assert rows[1]["forward"] == 48.0 and rows[1]["sample"] == 0.0


def test_ptd_is_named_by_its_drafter_not_vllms_custom_class():
    from vllm_ptd.vllm_integration.proposer import PTDProposer

    runner = SimpleNamespace(speculative_config=SimpleNamespace(method="custom_class"),
                             drafter=object.__new__(PTDProposer))
    assert stage_trace._method(runner) == "ptd"
    assert stage_trace._method(SimpleNamespace(speculative_config=None)) == "plain"


def test_nothing_is_installed_without_the_variable(monkeypatch):
    monkeypatch.delenv(stage_trace.TRACE_ENV, raising=False)
    assert stage_trace.install_from_env() is False
