"""`vllm serve` with PTD under load: 16 concurrent clients, a mixed stream of requests, twice.

Every request is greedy in effect (temperature 0, or n=2 with top_p=1e-6, whose every sample
is the argmax). The mix: chat and completions, streamed and not, about 10% closed by the client
after a few chunks, structured output (json_schema, choice), logprobs, n=2, stop strings,
and n=2 at temperature 0 (which vLLM refuses with a 400). Asserted:
- every completed request equals the plain server's answer to the same request (text and
  finish reason always; token ids and logprobs where the response carries them);
- the server stays healthy; the refused requests get the same 400 from both servers;
- after each round PTD holds no per-request state (`live_states == 0`, read from the worker
  through vLLM's dev endpoint `POST /collective_rpc` and PTD's worker extension) and no PTD
  fallback happened; PTD really drafted and accepted (tokens > steps);
- a second identical round grows the server's resident memory (API server, engine core and
  worker processes together) by less than RSS_GROWTH_BOUND_MIB.
"""

from __future__ import annotations

import asyncio
import random
import re
import time

import pytest
from serve_helpers import SERVED_NAME, Server, Spec, compare, drive, vllm_server

pytestmark = pytest.mark.engine

N_REQUESTS = 80
CLIENTS = 16
MAX_MODEL_LEN = 2048
# A smaller node budget than the CPU default (24/16): every PTD path (C and T rows, tree
# verification, KV compaction, state release) is exercised, while a step of 16 requests stays
# affordable on the 2-core CI machine (each tree row is a token the target runs).
# A fixed budget: under 16 clients on 2 cores the adaptive budget (the default) rightly
# drafts nothing, and this test is about trees under load (aborts, mixed requests, memory).
PTD_SPEC = {"method": "ptd", "max_nodes": 12, "max_candidate_nodes": 8, "adaptive_budget": False,
            "draft_shape": "tree"}
EXTENSION = "vllm_ptd.vllm_integration.introspection.PTDWorkerExtension"
# glibc's allocator keeps freed memory and grows its arenas in large steps, which makes RSS a
# noisy measure of what a process holds. For the memory check the server runs with a fixed
# mmap threshold (large blocks, i.e. tensors, go back to the OS when freed), trimming and two
# arenas; that is a test setting, not advice for deployments.
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072",
              "MALLOC_TRIM_THRESHOLD_": "262144"}
# Measured here (2 shared cores, float32 SmolLM2-135M, 162 requests per round, server RSS
# ~4.3 GiB over API server + engine core + worker): the second round grew RSS by 59, 69 and
# 87 MiB in three runs, all of it in the worker, with PTD's Python-side memory flat
# (tracemalloc: ~0.01 MiB per round, live_states 0); the third and fourth rounds grew it by
# 3 to 87 MiB more, not steadily; a plain server grew by 8 to 26 MiB. The bound leaves ~2x
# room over the largest growth seen and still catches a leak of ~1.5 MiB per request (e.g. one
# retained vocabulary-sized logits row per tree step).
RSS_GROWTH_BOUND_MIB = 160

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _questions() -> list[str]:
    from vllm_ptd.datasets import DATASETS, sample_prompts

    return [q for name in DATASETS for q in sample_prompts(name, 20)]


def make_specs() -> list[Spec]:
    rng = random.Random(8)
    questions = _questions()
    specs = []
    for i in range(N_REQUESTS):
        question = questions[i % len(questions)]
        endpoint = "chat" if i % 2 == 0 else "completion"
        body: dict = {"model": SERVED_NAME, "max_tokens": rng.randint(8, 48),
                      "temperature": 0.0, "extra_body": {}}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": question}]
        else:
            # mixed prompt lengths: a prefix of the question, 40 characters to all of it
            body["prompt"] = question[: rng.randint(40, max(41, len(question)))]
        stream = rng.random() < 0.5
        kind = rng.choices(["plain", "structured", "logprobs", "n2", "stop"],
                           weights=[55, 10, 10, 10, 15])[0]
        if kind == "structured":
            if endpoint == "chat":
                body["messages"][0]["content"] += " Answer as JSON with a name and an age."
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "person", "schema": SCHEMA}}
            else:
                body["extra_body"]["structured_outputs"] = {"choice": ["yes", "no", "maybe"]}
        elif kind == "logprobs":
            stream = False
            if endpoint == "chat":
                body.update(logprobs=True, top_logprobs=2)
            else:
                body["logprobs"] = 2
        elif kind == "n2":
            # n > 1 needs temperature > 0 in vLLM; top_p=1e-6 keeps only the most likely
            # token, so every sample is the argmax. (Not top_k=1: vLLM 0.32's CPU rejection
            # sampler crashes on top_k in a step that verifies drafts, ngram included.)
            # No seed: vLLM 0.32 CPU stops the engine when a seeded request's prompt is split
            # over steps (`CPU Generator does not use offset`, docs/guarantees.md), which 32
            # clients at once can cause on the plain server too; seeded sampling is checked
            # in test_vllm_sampling_ptd.py.
            body.update(n=2, temperature=1.0, top_p=1e-6)
        elif kind == "stop":
            body["stop"] = rng.choice([["\n"], ["."], [",", "\n\n"], [" the "]])
        if not stream:
            body["extra_body"]["return_token_ids"] = True
        abort_after = rng.randint(1, 3) if stream and rng.random() < 0.2 else 0
        specs.append(Spec(i, endpoint, body, stream, abort_after))
    for j in range(2):  # refused by vLLM itself: n > 1 with greedy sampling
        specs.append(Spec(N_REQUESTS + j, "completion",
                          {"model": SERVED_NAME, "prompt": questions[j], "max_tokens": 8,
                           "temperature": 0.0, "n": 2}, expect_error=True))
    random.Random(1).shuffle(specs)
    return specs


def _aborted_total(server: Server) -> int:
    """Requests the server aborted because their client went away (logged one per line by
    vLLM's `--enable-log-requests`)."""
    return len(re.findall(r"Request \S+ aborted\.", server.log_path.read_text(errors="replace")))


@pytest.fixture(scope="module")
def specs() -> list[Spec]:
    return make_specs()


@pytest.fixture(scope="module")
def plain_answers(specs):
    """The plain server's answer to every request (non-streamed, never closed early: the
    complete answer a streamed or closed request would have had)."""
    from vllm_ptd.model import default_model_path

    with vllm_server(default_model_path(), None, max_model_len=MAX_MODEL_LEN) as server:
        return asyncio.run(drive(server.base_url, specs, clients=32, streamed=False))


def test_load_two_rounds_equal_plain_state_released_memory_bounded(specs, plain_answers,
                                                                   record_property):
    from vllm_ptd.model import default_model_path

    n_abort = sum(1 for s in specs if s.abort_after)
    n_chat = sum(1 for s in specs if s.endpoint == "chat")
    n_stream = sum(1 for s in specs if s.stream)
    print(f"\n{len(specs)} requests: {n_chat} chat, {n_stream} streamed, {n_abort} closed "
          f"early by the client")
    assert 0.05 * N_REQUESTS <= n_abort <= 0.2 * N_REQUESTS
    rss = []
    with vllm_server(default_model_path(), PTD_SPEC, max_model_len=MAX_MODEL_LEN,
                     extra_args=["--worker-extension-cls", EXTENSION, "--enable-log-requests"],
                     env={"VLLM_SERVER_DEV_MODE": "1", **MALLOC_ENV}) as server:
        for round_no in (1, 2):
            before = server.settled_snapshot()
            aborted_before = _aborted_total(server)
            started = time.monotonic()
            got = asyncio.run(drive(server.base_url, specs, clients=CLIENTS, streamed=True))
            seconds = time.monotonic() - started
            assert server.healthy(), server.log_tail()
            assert compare(specs, got, plain_answers) == []
            snap = server.settled_snapshot()
            assert snap["live_states"] == 0
            assert snap["fallbacks"] == 0
            steps, tokens = snap["steps"] - before["steps"], snap["tokens"] - before["tokens"]
            assert steps > 0 and tokens > steps  # PTD drafted and accepted under this load
            # the server aborted the requests whose client closed the stream early (a request
            # that had already ended by then is not aborted: at least half of them were)
            aborted = _aborted_total(server) - aborted_before
            assert n_abort // 2 <= aborted <= n_abort
            rss.append(server.rss_mib())
            print(f"round {round_no}: {seconds:.0f} s, DE {tokens / steps:.2f}, {aborted} "
                  f"aborted by the server, server RSS {rss[-1]:.0f} MiB")
            record_property(f"round{round_no}_seconds", round(seconds, 1))
        assert server.healthy()
    growth = rss[1] - rss[0]
    record_property("rss_growth_mib", round(growth, 1))
    print(f"RSS growth over the second round: {growth:+.1f} MiB "
          f"(bound {RSS_GROWTH_BOUND_MIB} MiB)")
    assert growth < RSS_GROWTH_BOUND_MIB
