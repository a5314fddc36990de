"""Tabulate the stage traces of multiprocess engines (`VLLM_PTD_STAGE_TRACE`,
vllm_ptd/vllm_integration/stage_trace.py): per method and number of draft rows in a step, the
median milliseconds of the step's period and of each stage, over decode steps (no prompt
tokens) of one request or of `--requests` requests.

    VLLM_PTD_STAGE_TRACE=/tmp/trace vllm-ptd bench --interleave --multiprocess \\
        --methods plain suffix ptd --datasets gsm8k --split tune --prompts 4 --max-tokens 64
    python benchmarks/stage_trace_report.py /tmp/trace.*.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

COLUMNS = ("period_ms", "inputs", "forward", "logits", "sample", "propose", "sample_tokens")


def load(paths: list[str]) -> list[dict]:
    """Every traced step of every file."""
    steps = []
    for path in paths:
        with open(path) as f:
            steps.extend({**json.loads(line), "file": path} for line in f if line.strip())
    return steps


def decode_steps(steps: list[dict], requests: int) -> list[dict]:
    """Steps of exactly `requests` requests whose tokens are one per request plus the drafts."""
    return [s for s in steps if s["requests"] == requests
            and s["tokens"] == s["requests"] + s["draft_rows"]]


def table(steps: list[dict], min_steps: int = 3) -> list[dict]:
    """One row per (method, draft rows) with at least `min_steps` steps: medians of COLUMNS,
    plus each method's mean period and rows over all its steps."""
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for s in steps:
        by_key[(s["method"], s["draft_rows"])].append(s)
    rows = []
    for (method, draft_rows), group in sorted(by_key.items()):
        if len(group) < min_steps:
            continue
        rows.append({"method": method, "draft_rows": draft_rows, "steps": len(group),
                     **{c: statistics.median(s.get(c, 0.0) for s in group) for c in COLUMNS}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--requests", type=int, default=1, help="requests in the steps tabulated")
    p.add_argument("--min-steps", type=int, default=3)
    args = p.parse_args()
    steps = decode_steps(load(args.files), args.requests)
    print("| method | draft rows | steps | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for r in table(steps, args.min_steps):
        print(f"| {r['method']} | {r['draft_rows']} | {r['steps']} | "
              + " | ".join(f"{r[c]:.1f}" for c in COLUMNS) + " |")
    for method in sorted({s["method"] for s in steps}):
        own = [s for s in steps if s["method"] == method]
        print(f"{method}: {len(own)} steps, mean period {statistics.mean(s['period_ms'] for s in own):.1f} ms, "
              f"mean draft rows {statistics.mean(s['draft_rows'] for s in own):.2f}")


if __name__ == "__main__":
    main()
