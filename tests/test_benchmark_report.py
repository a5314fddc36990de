"""The benchmark's bookkeeping on synthetic rows, without an engine: metric deltas, speedups,
mismatch counts, the paper-style markdown, the PNG plots and the server client pool."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ptd_bench import counters, methods, outputs, report, server
from benchmarks.ptd_bench.main import write_outputs
from benchmarks.ptd_bench.workloads import Workload, load_workload, messages_for

DATASETS = ("mt_bench", "gsm8k", "humaneval", "mbpp")


def _row(method, kind, dataset, tps, de, conc=1, mode="offline", **extra):
    return {"mode": mode, "method": method, "kind": kind, "dataset": dataset,
            "concurrency": conc, "requests": 4, "tokens": 100, "seconds": 100 / tps,
            "tokens_per_s": tps, "DE": de, "HR": 0.5, "AL": 2.0, "C_nodes_per_step": 3.0,
            "T_nodes_per_step": 20.0, "host_ms_per_step": 0.3, "steps": 50,
            "accepted_by_depth": [25, 10], "mismatches": 0 if kind != "plain" else None,
            **extra}


@pytest.fixture
def rows():
    out = []
    for d in DATASETS:
        out.append(_row("plain", "plain", d, 10.0, 1.0))
        out.append(_row("ngram k=4", "ngram", d, 12.0, 1.3))
        out.append(_row("ptd", "ptd", d, 15.0, 2.5))
    outputs.add_speedups(out)
    return out


def test_speedup_is_relative_to_plain_on_the_same_dataset_and_concurrency(rows):
    extra = [_row("plain", "plain", "gsm8k", 40.0, 1.0, conc=4),
             _row("ptd", "ptd", "gsm8k", 20.0, 2.0, conc=4)]
    rows += extra
    outputs.add_speedups(rows)
    assert {r["method"]: r["speedup"] for r in rows if r["concurrency"] == 1
            and r["dataset"] == "mbpp"} == {"plain": 1.0, "ngram k=4": 1.2, "ptd": 1.5}
    assert extra[1]["speedup"] == 0.5


def test_paper_table_has_methods_as_rows_and_speedup_and_de_per_dataset(rows):
    table = report.paper_table(rows, "offline", 1).splitlines()
    assert table[0] == ("| Method | MT-Bench Speedup | MT-Bench DE | GSM-100 Speedup | GSM-100 DE"
                        " | HumanEval Speedup | HumanEval DE | MBPP-100 Speedup | MBPP-100 DE"
                        " | Mean Speedup | Mean DE |")
    assert [line.split(" | ")[0] for line in table[2:]] == ["| plain", "| ngram k=4", "| ptd"]
    assert table[-1] == ("| ptd | 1.50x | 2.50 | 1.50x | 2.50 | 1.50x | 2.50 | 1.50x | 2.50"
                         " | 1.50x | 2.50 |")
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_missing_cells_print_a_dash():
    rows = [_row("plain", "plain", "gsm8k", 10.0, 1.0), _row("ptd", "ptd", "mbpp", 10.0, None)]
    outputs.add_speedups(rows)
    table = report.paper_table(rows, "offline", 1)
    assert table.splitlines()[-1] == "| ptd | - | - | - | - | - | - |"


def test_detail_table_reports_depth_rates_and_mismatches(rows):
    rows[2]["mismatches"] = 3
    text = report.detail_table(rows)
    assert "| 0.50 / 0.20 |" in text
    assert "| 3/4 |" in text


def test_render_states_machine_command_and_total_mismatches(rows):
    rows[2]["mismatches"] = 2
    sweep = [dict(_row("ptd w=2 d=6", "ptd", "mt_bench", 9.0, 2.0), width=2, depth=6)]
    md = report.render({"date": "today", "machine": "2 CPU cores", "model": "m",
                        "command": "vllm-ptd bench --smoke", "note": "CPU numbers"}, rows, sweep)
    assert "vllm-ptd bench --smoke" in md and "CPU numbers" in md
    assert "## Width / depth sweep" in md and "| 2 | 6 | MT-Bench |" in md
    assert "Greedy mismatches against plain decoding: **2**." in md


def test_write_outputs_writes_json_markdown_and_pngs(rows, tmp_path):
    rows += [_row("plain", "plain", "gsm8k", 30.0, 1.0, conc=4),
             _row("ptd", "ptd", "gsm8k", 33.0, 2.0, conc=4)]
    outputs.add_speedups(rows)
    sweep = [dict(_row(f"ptd w={w} d={d}", "ptd", "gsm8k", 10.0 + w, 1.5 + d / 10),
                  width=w, depth=d) for w, d in [(1, 6), (2, 6), (4, 6), (8, 6), (4, 2), (4, 8)]]
    written = write_outputs(tmp_path, {"date": "x"}, rows, sweep)
    names = {p.name for p in written}
    assert {"results.json", "results.md", "speedup_offline_c1.png", "speedup_offline_c4.png",
            "speedup_vs_concurrency_offline.png", "sweep_width_depth.png"} <= names
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ptd_metrics_are_taken_over_the_difference_of_two_snapshots():
    def snap(steps, tokens, hits, accepted, c, t, ms, depth):
        return {"steps": steps, "tokens": tokens, "hits": hits, "accepted": accepted,
                "C_nodes": c, "T_nodes": t, "host_ms": ms, "fallbacks": 0, "by_depth": depth}

    budget = {"cost_model_ms": {"a": 20.0, "b_per_token": 0.5, "c_per_drafting_request": 1.0}}
    m = counters.ptd_metrics(snap(10, 15, 4, 5, 30, 200, 3.0, [4, 1]),
                             {**snap(30, 65, 14, 35, 90, 600, 9.0, [14, 9, 1]),
                              "budget": budget})
    assert m["DE"] == 50 / 20 and m["HR"] == 10 / 20 and m["AL"] == 1 + 30 / 10
    assert m["C_nodes_per_step"] == 3.0 and m["T_nodes_per_step"] == 20.0
    assert m["host_ms_per_step"] == pytest.approx(0.3)
    assert m["accepted_by_depth"] == [10, 8, 1]
    assert m["budget_at_end"] == budget   # the policy's state when the run ended, not a difference


def test_vllm_metrics_count_decode_steps_without_prefill():
    before = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "by_depth": []}
    after = {"drafts": 20, "draft_tokens": 80, "accepted": 30, "by_depth": [20, 8, 2]}
    # 2 requests, 72 tokens: 2 from prefill, 70 decoded in 70 - 30 = 40 steps
    m = counters.vllm_metrics(before, after, tokens=72, requests=2)
    assert m["DE"] == 70 / 40 and m["HR"] == 0.5 and m["AL"] == 2.5
    assert m["C_nodes_per_step"] == 2.0 and m["accepted_by_depth"] == [20, 8, 2]


def test_compare_counts_each_differing_request_and_where_it_diverges():
    wl = Workload("mt_bench", [["a", "b"], ["c", "d"]])
    res = outputs.compare([[1, 2], [3], [5, 6, 7], [8]], [[1, 2], [3, 4], [5, 0, 7], [8]], wl)
    assert res["mismatches"] == 2
    assert res["mismatched"] == [{"conversation": 0, "turn": 1, "first_difference": 1},
                                 {"conversation": 1, "turn": 0, "first_difference": 1}]
    assert outputs.compare([[1]], None, wl)["mismatches"] is None


def test_methods_run_plain_first_and_label_each_ptd_config():
    ms = methods.build_methods(["ptd", "suffix", "plain", "ngram"],
                               ["{}", 'small={"max_nodes": 24}', '{"width": 2}'])
    assert [m.label for m in ms] == ["plain", "ngram k=4", "suffix", "ptd", "small",
                                     'ptd {"width":2}']
    assert ms[4].ptd == {"max_nodes": 24} and ms[1].spec["method"] == "ngram"
    with pytest.raises(ValueError):
        methods.build_methods(["ptd"], ["{}", "{}"])


def test_sweep_covers_width_then_depth_without_repeating_the_default_point():
    ms = methods.sweep_methods({"max_nodes": 32}, [1, 2, 4, 8], [2, 4, 6, 8])
    points = [(m.ptd["width"], m.ptd["depth"]) for m in ms]
    assert points == [(1, 6), (2, 6), (4, 6), (8, 6), (4, 2), (4, 4), (4, 8)]
    assert all(m.ptd["max_nodes"] == 32 for m in ms)


def test_mt_bench_is_two_turns_and_turn_two_carries_the_first_answer():
    wl = load_workload("mt_bench", 3)
    assert len(wl.conversations) == 3 and wl.num_requests == 6
    msgs = messages_for(wl.conversations[0], ["ANSWER"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == "ANSWER"
    assert load_workload("humaneval").num_requests == 164
    assert load_workload("gsm8k").num_requests == load_workload("mbpp").num_requests == 100


def test_the_tune_and_heldout_halves_split_each_set_for_good():
    from vllm_ptd.datasets import DATASETS, paper_subset

    for name in DATASETS:
        whole = paper_subset(name)
        tune, heldout = paper_subset(name, split="tune"), paper_subset(name, split="heldout")
        assert tune + heldout == whole and abs(len(tune) - len(heldout)) <= 1
        # the order is fixed: asking again gives the same halves
        assert paper_subset(name, split="heldout") == heldout
    # every earlier tuning run took its questions from the first 40 of a set
    assert all(len(paper_subset(name, split="tune")) >= 40 for name in DATASETS)
    assert load_workload("gsm8k", 2, split="heldout").conversations[0] == [
        paper_subset("gsm8k")[50]["question"]]
    with pytest.raises(ValueError, match="unknown split 'test'"):
        paper_subset("gsm8k", split="test")


class _FakeClient:
    """Answers with the number of messages it saw, so turn 2's history is visible."""

    def __init__(self):
        self.seen = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))
        self.models = SimpleNamespace(list=lambda: SimpleNamespace(data=[SimpleNamespace(id="m")]))

    def _create(self, model, messages, temperature, max_tokens):
        assert temperature == 0.0
        self.seen.append(messages)
        text = f"{messages[-1]['content']}#{len(messages)}"
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))],
                               usage=SimpleNamespace(completion_tokens=3))


def test_server_mode_counts_tokens_and_mismatches_against_a_plain_reference(tmp_path):
    import json

    wl = Workload("mt_bench", [["q1", "q2"], ["r1", "r2"]])
    client = _FakeClient()
    plain = server.run("url", "plain", None, [wl], [2], 8, None, False, client)
    assert plain[0]["outputs"] == ["q1#1", "q2#3", "r1#1", "r2#3"]
    assert plain[0]["tokens"] == 12 and plain[0]["kind"] == "plain"
    # turn 2 was asked after the server's own turn-1 answer
    assert any(m[1] == {"role": "assistant", "content": "q1#1"} for m in client.seen
               if len(m) == 3)
    plain[0]["outputs"][3] = "different"
    ref = tmp_path / "plain.json"
    ref.write_text(json.dumps({"rows": plain}))
    rows = server.run("url", "ptd", None, [wl], [2], 8, str(ref), False, _FakeClient())
    assert [r["method"] for r in rows] == ["plain (reference)", "ptd"]
    assert rows[1]["mismatches"] == 1
    outputs.add_speedups(rows)
    assert rows[1]["speedup"] is not None


class _FakeLLM:
    """An offline engine stand-in: answers each prompt with its own label's tokens and logs
    every generate call in a shared list, so the order in which methods ran is visible."""

    def __init__(self, label: str, log: list, tokens: list[int]):
        self.label, self.log, self.tokens = label, log, tokens
        self.tokenizer = SimpleNamespace(
            apply_chat_template=lambda msgs, tokenize, add_generation_prompt: msgs[-1]["content"])

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self):
        pass

    def get_metrics(self):
        return []

    def generate(self, prompts, params, use_tqdm=False):
        self.log.append((self.label, tuple(prompts)))
        out = SimpleNamespace(text="a", token_ids=list(self.tokens))
        return [SimpleNamespace(outputs=[out]) for _ in prompts]


def test_interleaved_runs_take_turns_per_generate_call_and_compare_with_plain(monkeypatch):
    from benchmarks.ptd_bench import main as bench_main
    from benchmarks.ptd_bench import offline
    from benchmarks.ptd_bench.methods import Method

    # The interleaved runner switches vLLM to in-process engines for the rest of its
    # process; keep that from leaking into later tests that start real engines.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    log: list = []
    answers = {"plain": [1, 2, 3], "other": [1, 2, 4]}
    monkeypatch.setattr(offline, "build_engine",
                        lambda m, *a: _FakeLLM(m.label, log, answers[m.label]))
    monkeypatch.setattr(offline, "warm_up", lambda llm: None)
    args = SimpleNamespace(interleave=True, model=None, dtype="float32", concurrency=[2],
                           max_model_len=64, compile=False, max_tokens=8, no_progress=True,
                           save_outputs=False, temperature=0.0, top_p=1.0, seed=0)
    wl = Workload("gsm8k", [["q1"], ["q2"], ["q3"]])
    methods_ = [Method("plain", "plain"), Method("other", "ngram")]
    rows, sweep = bench_main.run_offline(args, methods_, [wl])
    assert sweep == []
    # groups of 2 then 1 requests, the two engines alternating
    assert log == [("plain", ("q1", "q2")), ("other", ("q1", "q2")),
                   ("plain", ("q3",)), ("other", ("q3",))]
    assert [r["method"] for r in rows] == ["plain", "other"]
    assert rows[0]["mismatches"] is None and rows[1]["mismatches"] == 3
    assert rows[1]["tokens"] == 9
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"   # restored at teardown


def test_repeat_runs_each_workload_again_with_the_caches_kept(monkeypatch):
    from benchmarks.ptd_bench import main as bench_main
    from benchmarks.ptd_bench import offline
    from benchmarks.ptd_bench.methods import Method

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    log: list = []
    resets: list = []
    monkeypatch.setattr(offline, "build_engine", lambda m, *a: _FakeLLM(m.label, log, [1, 2]))
    monkeypatch.setattr(offline, "warm_up", lambda llm: None)
    monkeypatch.setattr(offline, "reset_caches", lambda llm, m: resets.append(m.label))
    args = SimpleNamespace(interleave=True, repeat=True, model=None, dtype="float32",
                           concurrency=[2], max_model_len=64, compile=False, max_tokens=8,
                           no_progress=True, save_outputs=False, temperature=0.0, top_p=1.0,
                           seed=0)
    methods_ = [Method("plain", "plain"), Method("other", "ngram")]
    rows, _ = bench_main.run_offline(args, methods_, [Workload("gsm8k", [["q1"], ["q2"]])])
    assert [(r["method"], r["dataset"]) for r in rows] == [
        ("plain", "gsm8k"), ("other", "gsm8k"),
        ("plain", "gsm8k, repeated"), ("other", "gsm8k, repeated")]
    assert resets == ["plain", "other"]   # the cold runs only
    assert len(log) == 4


def test_a_users_prompts_file_becomes_one_workload(tmp_path):
    from benchmarks.ptd_bench.workloads import load_prompts_file

    path = tmp_path / "mine.jsonl"
    path.write_text('"What is 2+2?"\n\n{"prompt": "Write a haiku."}\n'
                    '{"turns": ["Name a colour.", "Why that one?"]}\n')
    work = load_prompts_file(str(path))
    assert work.dataset == "mine"
    assert work.conversations == [["What is 2+2?"], ["Write a haiku."],
                                  ["Name a colour.", "Why that one?"]]
    assert work.num_requests == 4
    assert load_prompts_file(str(path), limit=1).conversations == [["What is 2+2?"]]


@pytest.mark.parametrize("text, problem", [
    ("{not json\n", "mine.jsonl:1: not JSON"),
    ('"ok"\n{"prompt": ""}\n', "mine.jsonl:2: expected a non-empty string"),
    ('{"turns": [1, 2]}\n', "mine.jsonl:1: expected"),
    ("\n\n", "no prompts"),
])
def test_a_bad_prompts_file_names_the_line(tmp_path, text, problem):
    from benchmarks.ptd_bench.main import main
    from benchmarks.ptd_bench.workloads import load_prompts_file

    path = tmp_path / "mine.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_prompts_file(str(path))
    with pytest.raises(SystemExit, match="--prompts-file: .*" + problem):
        main(["--prompts-file", str(path)])
