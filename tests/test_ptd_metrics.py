"""PTD on a running server's Prometheus `/metrics`: PTD's own figures, and vLLM's spec-decode
counters with a tree's depth (the most one step can accept) as its draft tokens."""

from __future__ import annotations

import urllib.request
from types import SimpleNamespace

import pytest
from serve_helpers import vllm_server

from vllm_ptd.vllm_integration import metrics

PTD_COUNTERS = ["steps", "drafted_steps", "tokens", "hit_steps", "accepted_on_hits",
                "fallbacks", "shared_rows", "budget_rows", "budget_steps"]
PTD_GAUGES = ["tokens_per_step", "hit_rate", "accept_length", "budget"]


def _scrape(root: str) -> dict[str, float]:
    """name (with a `{kind}` suffix where labelled so) -> value, summed over engines."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{root}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:") or sample.name.endswith("_created"):
                continue
            name = sample.name
            for label in ("kind", "position"):
                if label in sample.labels:
                    name += "{" + sample.labels[label] + "}"
            out[name] = out.get(name, 0.0) + sample.value
    return out


def _chat(base_url: str, question: str, salt: str | None = None) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none")
    reply = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=64, extra_body=None if salt is None else {"cache_salt": salt})
    return reply.choices[0].message.content


@pytest.mark.engine
def test_a_ptd_server_exports_ptd_metrics_and_tree_aware_spec_decode_counters():
    from vllm_ptd.model import default_model_path

    # Trees at a fixed budget: a tree has many more rows than its depth, which is what
    # vLLM's draft-token counter now counts.
    spec = {"method": "ptd", "draft_shape": "tree", "adaptive_budget": False}
    with vllm_server(default_model_path(), spec) as server:
        before = _scrape(server.root)
        for name in PTD_COUNTERS:
            assert before[f"vllm:ptd_{name}_total"] == 0, name   # present from the start
        for name in PTD_GAUGES:
            assert f"vllm:ptd_{name}" in before, name
        questions = ["List the numbers from 1 to 40, separated by commas.",
                     "Write a Python function that returns the sum of a list.",
                     "Explain in three sentences why the sky is blue."]
        for question in questions:
            assert _chat(server.base_url, question)
        after = _scrape(server.root)
        _chat(server.base_url, questions[0], salt="tenant-a")   # through the API's cache_salt
        later = _scrape(server.root)

    def total(name: str, at=after) -> float:
        return at[f"vllm:ptd_{name}_total"]

    steps, tokens = total("steps"), total("tokens")
    assert steps > 0 and total("drafted_steps") > 0
    assert after["vllm:ptd_tokens_per_step"] == pytest.approx(tokens / steps)
    assert after["vllm:ptd_tokens_per_step"] >= 1.0
    assert 0.0 <= after["vllm:ptd_hit_rate"] <= 1.0
    assert after["vllm:ptd_accept_length"] >= 1.0
    assert after["vllm:ptd_budget"] == 15      # max_nodes, the fixed budget
    assert total("fallbacks") == 0
    rows = after["vllm:ptd_rows_total{C}"] + after["vllm:ptd_rows_total{T}"]
    assert after["vllm:ptd_rows_total{T}"] > 0          # trees, not chains
    assert after["vllm:ptd_rows_per_step{C}"] == pytest.approx(
        after["vllm:ptd_rows_total{C}"] / steps)

    # vLLM's spec-decode counters: one draft per verified tree, its depth as draft tokens.
    drafts = after["vllm:spec_decode_num_drafts_total"]
    drafted = after["vllm:spec_decode_num_draft_tokens_total"]
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafts == total("drafted_steps")
    assert 0 < accepted <= drafted < rows          # depth, not every row of the tree
    assert drafted <= 15 * drafts
    assert accepted == tokens - steps              # every PTD step commits accepted + 1
    assert after["vllm:spec_decode_num_accepted_tokens_per_pos_total{0}"] <= drafts

    # counters only grow, and grow with requests
    for name in ("steps", "tokens", "drafted_steps"):
        assert total(name, later) > total(name)
    assert later["vllm:spec_decode_num_draft_tokens_total"] > drafted


def test_reserved_stats_key_is_taken_out_before_vllms_loggers_see_it():
    stats = SimpleNamespace(kv_connector_stats={metrics.REPORT_KEY: {"steps": 3}})
    assert metrics.take_report(stats) == {"steps": 3}
    assert stats.kv_connector_stats is None
    stats = SimpleNamespace(kv_connector_stats={"nixl": 1, metrics.REPORT_KEY: {"steps": 1}})
    assert metrics.take_report(stats) == {"steps": 1}
    assert stats.kv_connector_stats == {"nixl": 1}
    assert metrics.take_report(stats) is None
    assert metrics.take_report(SimpleNamespace(kv_connector_stats=None)) is None


def test_tree_depth_replaces_row_count_in_vllms_spec_decode_stats():
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    def original(self, stats, num_draft_tokens, num_accepted_tokens, invalid, request_id):
        stats = stats or SpecDecodingStats.new(15)
        stats.observe_draft(num_draft_tokens, num_accepted_tokens)
        return stats

    wrapped = metrics.make_make_spec_decoding_stats(original)
    scheduler = SimpleNamespace(_ptd_depths={"tree": 4})
    stats = wrapped(scheduler, None, 15, 3, None, "tree")     # a 15-row tree of depth 4
    stats = wrapped(scheduler, stats, 5, 1, None, "other")    # not a PTD tree: as vLLM
    assert stats.num_draft_tokens == 4 + 5 and stats.num_accepted_tokens == 4
    assert stats.num_draft_tokens_per_pos[:6] == [2, 2, 2, 2, 1, 0]
    plain = SimpleNamespace()                                 # a scheduler without PTD
    assert wrapped(plain, None, 15, 3, None, "tree").num_draft_tokens == 15


class _Untouchable:
    """A plain engine's object (runner, scheduler, stat logger manager, runner output) that
    fails the test on any attribute write."""

    def __init__(self, **attrs) -> None:
        for name, value in attrs.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AssertionError(f"a PTD wrapper wrote .{name} in a plain engine")


def _recorder():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "vllm's result"

    return original, calls


@pytest.mark.parametrize("drafter", [None, "an ngram proposer"])
def test_metric_wrappers_return_straight_to_vllm_for_plain_engines(drafter):
    from vllm_ptd.vllm_integration import tenants

    plain_config = SimpleNamespace(speculative_config=None)
    cases = [
        (metrics.make_sample_tokens, _Untouchable(drafter=drafter), ("grammar",)),
        (tenants.make_execute_model, _Untouchable(drafter=drafter), ("scheduler_output",)),
        (tenants.make_update_after_schedule, _Untouchable(vllm_config=plain_config),
         ("scheduler_output",)),
        (metrics.make_update_from_output, _Untouchable(), ("scheduler_output",
                                                           _Untouchable())),
        (metrics.make_make_spec_decoding_stats, _Untouchable(), (None, 15, 3, None, "r")),
        (metrics.make_manager_init, _Untouchable(), (plain_config,)),
        (metrics.make_manager_record, _Untouchable(), (_Untouchable(kv_connector_stats=None),
                                                       None)),
    ]
    for make, owner, args in cases:
        original, calls = _recorder()
        assert make(original)(owner, *args) == "vllm's result", make
        assert calls == [((owner, *args), {})], make
