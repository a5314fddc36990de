"""`vllm serve` with PTD answers through the OpenAI-compatible API exactly like plain vLLM."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

QUESTION = "Explain in three sentences why the sky is blue."
COMPLETION_PROMPT = "The three primary colors are"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _server(model: str, spec: dict | None):
    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "2048", "--served-model-name", "smol"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-serve-{port}.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"vllm serve exited early:\n{log.read()[-4000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("vllm serve did not become healthy in 600 s")
                time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _answers(base_url: str) -> dict[str, str]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none")
    chat = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_tokens=96)
    completion = client.completions.create(model="smol", prompt=COMPLETION_PROMPT,
                                           temperature=0, max_tokens=64)
    stream = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_tokens=96, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    return {"chat": chat.choices[0].message.content, "completion": completion.choices[0].text,
            "chat_stream": streamed}


def test_served_ptd_text_equals_the_plain_servers():
    from vllm_ptd.model import default_model_path

    model = default_model_path()
    with _server(model, {"method": "ptd"}) as url:
        ptd = _answers(url)
    with _server(model, None) as url:
        plain = _answers(url)
    assert ptd == plain
    assert len(plain["chat"]) > 20 and plain["chat_stream"] == plain["chat"]


def test_serve_refuses_a_bad_ptd_key_with_its_name():
    from vllm_ptd.model import default_model_path

    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", default_model_path(),
           "--speculative-config", json.dumps({"method": "ptd", "depht": 3})]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, check=False)
    assert out.returncode != 0
    assert "depht" in out.stderr + out.stdout
