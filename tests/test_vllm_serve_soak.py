"""Soak with faults: `vllm serve` with PTD trees, 16 concurrent clients, a few hundred mixed
requests, while faults are injected at random stages of PTD's per-step code.

The server runs tests/fault_injection.py's worker extension (test-only, through vLLM's dev
endpoint `POST /collective_rpc`, loopback only). Requests: chat and completions, streamed and
not, greedy (some with a repetition penalty), seeded sampled (some with penalties and top-p),
unseeded sampled, some streams closed by the client after a few chunks. Rounds on one server:
1. unfaulted, nothing streamed or closed early: the reference answer of every request;
2., 3. and 4. the same requests streamed and closed as specified, while a background task
   injects 1-2 faults at a random stage every ~0.8 s.
Asserted after each faulted round: no request lost (every request not closed by its client
completed, without an error), greedy and seeded answers equal to the reference (text, finish
reason, token ids where returned), faults fired at several stages and PTD fell back, the
server healthy, PTD's per-request state back to empty (`live_states == 0`); and the server's
resident memory grew by less than RSS_GROWTH_BOUND_MIB a round, on average over the last two
faulted rounds. RSS over one round is noisy (all of the growth is in the worker: measured
+132, +27, +64 MiB over faulted rounds 2-4 of one run, +87 and +136 MiB over rounds 2-3 of
another, and once +316 MiB over round 2 alone, on the code from before and after
`draft_shape` "auto" alike); a leak grows every round, so the mean of two rounds keeps it in
sight with half the noise. Where the worker's growth of ~1 MiB per request and round comes
from was not established.

The server runs without prefix caching: with it, one seeded request got a wrong first token on
the second and third pass over the same prompts, faults or not; a defect of vLLM 0.32's CPU
build with speculative decoding and prefix caching, which its own `ngram` method shows on the
same requests (benchmarks/repro_prefix_cache_spec_decode.py). This test is about faults.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from serve_helpers import SERVED_NAME, Result, Server, Spec, compare, drive, vllm_server

pytestmark = pytest.mark.engine

N_REQUESTS = 96
CLIENTS = 16
MAX_MODEL_LEN = 1024
FAULT_PERIOD_S = 0.8
# Stages picked by weight: an attention fault fails every masked tree of its step, and a
# fallback fault needs another stage's failure; most requests should still draft.
STAGE_WEIGHTS = {"propose": 2, "layout": 2, "attention": 1, "verify": 2, "compaction": 2,
                 "fallback": 1}
# Small fixed trees (see test_vllm_serve_load.py): every PTD stage runs under load.
PTD_SPEC = {"method": "ptd", "max_nodes": 8, "max_candidate_nodes": 6, "adaptive_budget": False,
            "draft_shape": "tree"}
EXTENSION = "fault_injection.PTDFaultExtension"
STAGES = ("propose", "layout", "attention", "verify", "compaction", "fallback")
# As in test_vllm_serve_load.py: glibc settings that make RSS a usable measure (test only),
# and its bound on the growth over rounds of the same requests.
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072",
              "MALLOC_TRIM_THRESHOLD_": "262144"}
RSS_GROWTH_BOUND_MIB = 160
FAULTED_ROUNDS = 3


def make_specs() -> list[Spec]:
    from vllm_ptd.datasets import DATASETS, sample_prompts

    questions = [q for name in DATASETS for q in sample_prompts(name, 16)]
    rng = random.Random(23)
    specs = []
    for i in range(N_REQUESTS):
        question = questions[i % len(questions)]
        endpoint = "chat" if i % 2 == 0 else "completion"
        body: dict = {"model": SERVED_NAME, "max_tokens": rng.randint(4, 16), "extra_body": {}}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": question}]
        else:
            body["prompt"] = question[: rng.randint(40, max(41, len(question)))]
        kind = rng.choices(["greedy", "greedy_penalty", "seeded", "seeded_penalties",
                            "unseeded"], weights=[40, 10, 25, 15, 10])[0]
        if kind.startswith("greedy"):
            body["temperature"] = 0.0
            if kind == "greedy_penalty":
                body["extra_body"]["repetition_penalty"] = 1.2
        elif kind == "seeded":
            body.update(temperature=0.9, seed=i)
        elif kind == "seeded_penalties":
            body.update(temperature=0.8, top_p=0.9, presence_penalty=0.4, seed=i)
        else:
            body["temperature"] = 1.0
        stream = rng.random() < 0.5
        if not stream:
            body["extra_body"]["return_token_ids"] = True
        abort_after = rng.randint(1, 3) if stream and rng.random() < 0.15 else 0
        specs.append(Spec(i, endpoint, body, stream, abort_after,
                          comparable=kind != "unseeded"))
    rng.shuffle(specs)
    return specs


async def _inject_randomly(server: Server, done: asyncio.Event, rng: random.Random) -> int:
    """Every ~FAULT_PERIOD_S until `done`: 1-2 faults at a random stage. Returns how many
    were requested."""
    requested = 0
    while not done.is_set():
        stage = rng.choices(list(STAGE_WEIGHTS), weights=list(STAGE_WEIGHTS.values()))[0]
        count = rng.randint(1, 2)
        assert await asyncio.to_thread(server.worker_rpc, "ptd_inject_faults", stage, str(count))
        requested += count
        try:
            await asyncio.wait_for(done.wait(), timeout=FAULT_PERIOD_S * rng.uniform(0.5, 1.5))
        except TimeoutError:
            pass
    return requested


async def _drive_with_faults(server: Server, specs: list[Spec]
                             ) -> tuple[dict[int, Result], int]:
    """The specs streamed through CLIENTS clients (serve_helpers.drive) while faults are
    injected beside them. Returns the results and the number of faults requested."""
    done = asyncio.Event()
    injector = asyncio.create_task(_inject_randomly(server, done, random.Random(len(specs))))
    try:
        results = await drive(server.base_url, specs, CLIENTS, streamed=True, any_error=True)
    finally:
        done.set()
        requested = await injector
    return results, requested


def _unfinished(result: Result) -> bool:
    """No finish reason: the request's stream ended without one (or without any choice)."""
    return not result.choices or any(c["finish_reason"] is None
                                     for c in result.choices.values())


def _problems(specs: list[Spec], got: dict[int, Result], want: dict[int, Result]
              ) -> list[str]:
    """serve_helpers.compare (greedy and seeded answers equal to the reference), and every
    request not closed by its client finished, sampled ones too."""
    unfinished = [f"#{s.index}: unfinished" for s in specs
                  if s.index in got and got[s.index].error is None and not s.abort_after
                  and _unfinished(got[s.index])]
    return compare(specs, got, want) + unfinished


def test_soak_with_faults_at_random_stages(record_property):
    import os

    from vllm_ptd.model import default_model_path

    specs = make_specs()
    tests_dir = str(Path(__file__).parent)
    pythonpath = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    with vllm_server(default_model_path(), PTD_SPEC, max_model_len=MAX_MODEL_LEN,
                     extra_args=["--worker-extension-cls", EXTENSION,
                                 "--no-enable-prefix-caching"],
                     env={"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": pythonpath,
                          **MALLOC_ENV}) as server:
        started = time.monotonic()
        want = asyncio.run(drive(server.base_url, specs, CLIENTS, streamed=False,
                                 any_error=True))
        assert [s.index for s in specs if want[s.index].error or _unfinished(want[s.index])] == []
        reference = server.settled_snapshot()
        assert reference["fallbacks"] == 0 and reference["live_states"] == 0
        assert reference["drafted_steps"] > 0
        rss = [server.rss_mib()]
        print(f"\n{len(specs)} requests, {sum(s.stream for s in specs)} streamed, "
              f"{sum(1 for s in specs if s.abort_after)} closed early; reference round "
              f"{time.monotonic() - started:.0f} s, server RSS {rss[0]:.0f} MiB")
        fired_before: dict[str, int] = {}
        fallbacks_before = reference["fallbacks"]
        for round_no in range(1, FAULTED_ROUNDS + 1):
            started = time.monotonic()
            got, requested = asyncio.run(_drive_with_faults(server, specs))
            seconds = time.monotonic() - started
            assert server.worker_rpc("ptd_clear_faults")
            assert server.healthy(), server.log_tail()
            assert _problems(specs, got, want) == []
            fired = server.worker_rpc("ptd_fault_counts")["fired"]
            new = {s: fired.get(s, 0) - fired_before.get(s, 0) for s in STAGES}
            fired_before = fired
            snap = server.settled_snapshot()
            assert snap["live_states"] == 0
            assert sum(1 for n in new.values() if n) >= 4, new   # several stages failed
            assert snap["fallbacks"] > fallbacks_before
            rss.append(server.rss_mib())
            print(f"faulted round {round_no}: {seconds:.0f} s, {requested} faults requested, "
                  f"fired {new}, {snap['fallbacks'] - fallbacks_before} fallbacks, "
                  f"server RSS {rss[-1]:.0f} MiB")
            fallbacks_before = snap["fallbacks"]
            record_property(f"round{round_no}_seconds", round(seconds, 1))
        # still serving, exactly: one more unfaulted request per endpoint kind
        again = asyncio.run(drive(server.base_url, specs[:CLIENTS], CLIENTS, streamed=False,
                                  any_error=True))
        assert _problems(specs[:CLIENTS], again, want) == []
        assert server.healthy()
        # Not asserted: KV moves. Accepted paths off the DFS prefix are rare with answers of
        # 4-16 tokens (0 in one 96-request reference round of 734 drafted steps; 1 in 2585
        # drafted steps over four 128-request rounds). Moves and compaction faults are
        # asserted where answers are longer: test_vllm_engine_ptd.py, test_fallbacks.py,
        # test_cuda_backend_in_engine.py.
        totals = server.settled_snapshot()
        print(f"over all rounds: {totals['drafted_steps']} drafted steps, "
              f"{totals['kv_moves']} KV moves")
    growth = (rss[-1] - rss[-3]) / 2
    record_property("rss_growth_mib", round(growth, 1))
    print(f"RSS growth a round over the last two faulted rounds: {growth:+.1f} MiB "
          f"(bound {RSS_GROWTH_BOUND_MIB} MiB)")
    assert growth < RSS_GROWTH_BOUND_MIB
