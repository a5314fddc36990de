"""Start `vllm serve` on the embedded model for tests (loopback only, a free port, float32),
and drive it with a pool of OpenAI clients.

`vllm_server` is shared by the tests/test_vllm_serve_*.py modules and tests/test_ptd_metrics.py;
`Spec`, `Result`, `run_request`, `drive` and `compare` by tests/test_vllm_serve_load.py and
tests/test_vllm_serve_soak.py. Not a test module.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SERVED_NAME = "smol"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_cli() -> str:
    return str(Path(sys.executable).with_name("vllm"))


@dataclass
class Server:
    root: str   # http://127.0.0.1:PORT
    proc: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root."""
        return f"{self.root}/v1"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.root}/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def post_json(self, path: str, payload: dict) -> dict:
        req = urllib.request.Request(f"{self.root}{path}", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def worker_rpc(self, method: str, *args: str):
        """vLLM's development endpoint (`VLLM_SERVER_DEV_MODE=1` and a worker extension):
        `method` on the one worker, its result."""
        (result,) = self.post_json("/collective_rpc",
                                   {"method": method, "args": list(args)})["results"]
        return result

    def settled_snapshot(self, timeout: float = 15.0) -> dict:
        """PTD's snapshot once the worker has learnt of the finished and aborted requests,
        which reach it with the engine's next step (an empty one when nothing else runs),
        just after the client saw them end: poll briefly. A leak stays above 0."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.worker_rpc("ptd_snapshot")
            if snap["live_states"] == 0 or time.monotonic() > deadline:
                return snap
            time.sleep(0.5)

    def rss_mib(self) -> float:
        """Resident memory of the server and its engine processes."""
        import psutil

        root = psutil.Process(self.proc.pid)
        procs = [root, *root.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs) / 2**20


@contextmanager
def vllm_server(model: str, spec: dict | None, max_model_len: int = 2048,
                extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                startup_timeout: float = 600) -> Iterator[Server]:
    """`vllm serve model` with `spec` as --speculative-config (None: plain decoding); waits
    for /health, terminates the server (and its engine) on exit."""
    port = free_port()
    cmd = [vllm_cli(), "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
           "--served-model-name", SERVED_NAME, *(extra_args or [])]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-serve-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.time() + startup_timeout
        while not server.healthy():
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited early:\n{server.log_tail()}")
            if time.time() > deadline:
                pytest.fail(f"vllm serve did not become healthy in {startup_timeout:.0f} s")
            time.sleep(2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@dataclass
class Spec:
    """One request of a client pool."""
    index: int
    endpoint: str            # "chat" or "completion"
    body: dict               # keyword arguments of the openai client call
    stream: bool = False
    abort_after: int = 0     # close the stream after this many chunks (0: read it all)
    expect_error: bool = False   # refused by the server: the refusal is the answer
    comparable: bool = True  # greedy or seeded: the answer is determined


@dataclass
class Result:
    # per choice index: text, finish_reason, token_ids and logprobs (the last two None when
    # the response does not carry them: streamed, or not asked for)
    choices: dict[int, dict] = field(default_factory=dict)
    error: str | None = None
    chunks: int = 0


def _logprobs_of(choice) -> list[float] | None:
    lp = getattr(choice, "logprobs", None)
    if lp is None:
        return None
    if getattr(lp, "content", None) is not None:  # chat
        return [t.logprob for t in lp.content]
    return list(lp.token_logprobs or [])             # completions


async def run_request(client, spec: Spec, streamed: bool, any_error: bool = False) -> Result:
    """`spec` through the AsyncOpenAI `client`: streamed (closed after `spec.abort_after`
    chunks when set) or not. A refusal (400) is recorded as the result's error, "400: message";
    with `any_error` every exception is, as "Type: message", else any other propagates."""
    from openai import BadRequestError

    api = client.chat.completions if spec.endpoint == "chat" else client.completions
    out = Result()
    try:
        if not streamed:
            resp = await api.create(**spec.body)
            for ch in resp.choices:
                text = ch.message.content if spec.endpoint == "chat" else ch.text
                out.choices[ch.index] = {"text": text, "finish_reason": ch.finish_reason,
                                         "token_ids": getattr(ch, "token_ids", None),
                                         "logprobs": _logprobs_of(ch)}
            return out
        stream = await api.create(**spec.body, stream=True)
        try:
            async for chunk in stream:
                out.chunks += 1
                for ch in chunk.choices:
                    entry = out.choices.setdefault(ch.index, {"text": "", "finish_reason": None,
                                                              "token_ids": None,
                                                              "logprobs": None})
                    piece = ch.delta.content if spec.endpoint == "chat" else ch.text
                    entry["text"] += piece or ""
                    if ch.finish_reason is not None:
                        entry["finish_reason"] = ch.finish_reason
                if spec.abort_after and out.chunks >= spec.abort_after:
                    break
        finally:
            await stream.close()
    except Exception as e:
        if any_error:
            out.error = f"{type(e).__name__}: {e}"
        elif isinstance(e, BadRequestError):
            out.error = f"400: {e.body.get('message') if isinstance(e.body, dict) else e}"
        else:
            raise
    return out


async def drive(base_url: str, specs: list[Spec], clients: int, streamed: bool,
                any_error: bool = False) -> dict[int, Result]:
    """`clients` workers take specs from one queue until it is empty; each request streamed
    when `streamed` and its spec says so (see `run_request` for `any_error`). The results by
    spec index."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    queue: asyncio.Queue[Spec] = asyncio.Queue()
    for spec in specs:
        queue.put_nowait(spec)
    results: dict[int, Result] = {}

    async def worker():
        while not queue.empty():
            spec = queue.get_nowait()
            results[spec.index] = await run_request(client, spec, streamed and spec.stream,
                                                    any_error)

    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await client.close()
    return results


def compare(specs: list[Spec], got: dict[int, Result], want: dict[int, Result]) -> list[str]:
    """What differs between `got` and the reference answers `want`: a request lost, a refusal
    not the reference's, an error; for a request read to its end and comparable: its choices,
    and per choice text and finish reason, token ids and logprobs (1e-3) where `got` carries
    them."""
    problems = []
    for spec in specs:
        g, w = got.get(spec.index), want[spec.index]
        if g is None:
            problems.append(f"#{spec.index}: lost")
            continue
        if spec.expect_error:
            if g.error is None or g.error != w.error:
                problems.append(f"#{spec.index}: refusal differs: {g.error!r} vs {w.error!r}")
            continue
        if g.error is not None:
            problems.append(f"#{spec.index}: error {g.error}")
            continue
        if spec.abort_after or not spec.comparable:
            continue  # closed by the client (nothing complete), or sampled: nothing to compare
        if sorted(g.choices) != sorted(w.choices):
            problems.append(f"#{spec.index}: choices {sorted(g.choices)} vs {sorted(w.choices)}")
            continue
        for k, gc in g.choices.items():
            wc = w.choices[k]
            for key in ("text", "finish_reason"):
                if gc[key] != wc[key]:
                    problems.append(f"#{spec.index}/{k} {spec.endpoint} {key}: "
                                    f"{gc[key]!r} != {wc[key]!r}")
            if gc["token_ids"] is not None and gc["token_ids"] != wc["token_ids"]:
                problems.append(f"#{spec.index}/{k}: token ids differ")
            if gc["logprobs"] is not None and (
                    len(gc["logprobs"]) != len(wc["logprobs"])
                    or any(abs(a - b) > 1e-3 for a, b in zip(gc["logprobs"], wc["logprobs"]))):
                problems.append(f"#{spec.index}/{k}: logprobs differ")
    return problems
