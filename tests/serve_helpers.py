"""Start `vllm serve` on the embedded model for tests (loopback only, a free port, float32).

Shared by tests/test_vllm_serve_ptd.py and tests/test_vllm_serve_load.py. Not a test module.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
