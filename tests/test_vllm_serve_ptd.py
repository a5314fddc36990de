"""`vllm serve` with PTD answers through the OpenAI-compatible API exactly like plain vLLM."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from serve_helpers import vllm_cli, vllm_server

pytestmark = pytest.mark.engine

QUESTION = "Explain in three sentences why the sky is blue."
COMPLETION_PROMPT = "The three primary colors are"


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


def test_serve_refuses_a_bad_ptd_key_with_its_name():
    from vllm_ptd.model import default_model_path

    cmd = [vllm_cli(), "serve", default_model_path(),
           "--speculative-config", json.dumps({"method": "ptd", "depht": 3})]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, check=False)
    assert out.returncode != 0
    assert "depht" in out.stderr + out.stdout


@pytest.fixture(scope="module")
def ptd_server():
    """One PTD server with the default config for this module's tests (a start is ~30-60 s)."""
    from vllm_ptd.model import default_model_path

    with vllm_server(default_model_path(), {"method": "ptd"}) as server:
        yield server


@pytest.fixture(scope="module")
def plain_answers():
    """The plain server's answers, its server stopped before the PTD server starts."""
    from vllm_ptd.model import default_model_path

    with vllm_server(default_model_path(), None) as server:
        return _answers(server.base_url)


def test_served_ptd_text_equals_the_plain_servers(plain_answers, ptd_server):
    assert _answers(ptd_server.base_url) == plain_answers
    assert ptd_server.healthy()
    assert len(plain_answers["chat"]) > 20
    assert plain_answers["chat_stream"] == plain_answers["chat"]


def test_vllm_bench_serve_runs_against_a_ptd_server(tmp_path, ptd_server):
    """vLLM's own client, as the README's recipe runs it: a custom dataset of the user's
    prompts (one JSON object with "prompt" a line), against a PTD server."""
    from vllm_ptd.model import default_model_path

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [
        "What is the capital of India?", "Name three primary colors.",
        "Explain why the sky is blue.", "What is 12 times 7?"]))
    port = ptd_server.root.rsplit(":", 1)[1]
    out = subprocess.run(
        [vllm_cli(), "bench", "serve", "--backend", "openai-chat",
         "--endpoint", "/v1/chat/completions", "--host", "127.0.0.1", "--port", port,
         "--model", "smol", "--tokenizer", default_model_path(), "--dataset-name", "custom",
         "--dataset-path", str(prompts), "--num-prompts", "4", "--custom-output-len", "24",
         "--max-concurrency", "2", "--temperature", "0", "--save-result",
         "--result-dir", str(tmp_path), "--result-filename", "result.json"],
        capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == 4 and result["failed"] == 0
    assert result["total_output_tokens"] > 20
