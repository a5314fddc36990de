"""Against a running OpenAI-compatible server (`vllm serve ...` with or without PTD): N
clients at once, each walking its conversations turn by turn with greedy chat requests.

`vllm bench serve` drives single-turn load better, but it cannot ask MT-Bench's second turn
after the model's own first answer, hence this small client pool. The server's method is not
visible from outside, so a run is labelled by the user; run the plain server once with
`--label plain`, then pass its results.json as `--reference` to runs against other servers
for speedups and mismatch counts."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from .outputs import compare
from .workloads import Workload, messages_for


def make_client(url: str):
    from openai import OpenAI

    # vLLM only checks the key when started with --api-key; the client insists on one.
    return OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"))


def _converse(client, model: str, turns: list[str], max_tokens: int) -> tuple[list[str], int]:
    answers, tokens = [], 0
    for _ in turns:
        resp = client.chat.completions.create(model=model, messages=messages_for(turns, answers),
                                              temperature=0.0, max_tokens=max_tokens)
        answers.append(resp.choices[0].message.content or "")
        tokens += resp.usage.completion_tokens
    return answers, tokens


def run_workload(client, model: str, label: str, workload: Workload, clients: int,
                 max_tokens: int, reference: list[str] | None = None, progress: bool = True
                 ) -> dict:
    """One row: completion tokens/s over the wall time of the whole workload."""
    convs = workload.conversations
    bar = tqdm(total=len(convs), unit="conv", leave=False, disable=not progress,
               desc=f"{label} | {workload.dataset} | clients={clients}")

    def one(turns):
        out = _converse(client, model, turns, max_tokens)
        bar.update(1)
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(one, convs))
    seconds = time.perf_counter() - start
    bar.close()
    outputs = [a for answers, _ in results for a in answers]
    tokens = sum(t for _, t in results)
    return {"mode": "server", "method": label, "kind": "plain" if label == "plain" else "server",
            "dataset": workload.dataset, "concurrency": clients, "requests": len(outputs),
            "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "outputs": outputs, **compare(outputs, reference, workload)}


def load_reference(path: str | None) -> list[dict]:
    """Rows of an earlier server run of plain decoding (its results.json)."""
    if not path:
        return []
    with open(path) as f:
        rows = json.load(f)["rows"]
    return [r for r in rows if r["mode"] == "server" and r["kind"] == "plain"]


def reference_outputs(ref_rows: list[dict], dataset: str, clients: int) -> list[str] | None:
    """Plain outputs for `dataset`, preferably at the same client count (greedy outputs
    should not depend on it, but batching can move ties)."""
    same = [r for r in ref_rows if r["dataset"] == dataset]
    same.sort(key=lambda r: r["concurrency"] != clients)
    return same[0]["outputs"] if same else None


def run(url: str, label: str, model: str | None, workloads: list[Workload],
        concurrency: list[int], max_tokens: int, reference: str | None,
        progress: bool = True, client=None) -> list[dict]:
    client = client or make_client(url)
    model = model or client.models.list().data[0].id
    ref_rows = load_reference(reference)
    rows = []
    for clients in concurrency:
        for workload in workloads:
            ref = reference_outputs(ref_rows, workload.dataset, clients)
            rows.append(run_workload(client, model, label, workload, clients, max_tokens, ref,
                                     progress))
    # The plain reference joins the tables so every row has its speedup and plain its own row.
    return [dict(r, method=r["method"] + " (reference)") for r in ref_rows] + rows
