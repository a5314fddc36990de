"""Command-line options of the benchmark (one parser, shared by `python -m` and `vllm-ptd`)."""

from __future__ import annotations

import argparse

from vllm_ptd.datasets import DATASETS, SPLITS

from .methods import METHODS

EPILOG = """examples:
  vllm-ptd bench --smoke
  vllm-ptd bench --datasets mt_bench gsm8k --prompts 10 --max-tokens 256
  vllm-ptd bench --methods plain ptd --ptd '{}' 'small={"max_nodes": 24}' --concurrency 1 4 16 32
  vllm-ptd bench --interleave --multiprocess --methods plain ngram ptd --prompts-file my.jsonl
  vllm-ptd bench --methods plain ptd --temperature 0.7 --top-p 0.9 --datasets gsm8k
  vllm-ptd bench --methods plain ptd --sweep --sweep-dataset mt_bench --prompts 10
  vllm-ptd bench --server-url http://localhost:8000/v1 --label plain --concurrency 1 8
  vllm-ptd bench --server-url http://localhost:8001/v1 --label ptd \\
      --reference benchmarks/results/plain/results.json

`suffix` needs arctic-inference==0.1.1, which has no wheel on PyPI and builds from source
(C++20 compiler, cmake, nanobind==2.9.2); see benchmarks/ptd_bench/README.md."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-ptd bench", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plain vs vLLM ngram/suffix vs PTD on the paper's prompt sets: tokens/s, "
                    "speedup, DE/HR/AL, nodes per step, greedy mismatches; JSON, markdown, PNG.")
    p.add_argument("--model", default=None, help="HF model path (default: embedded SmolLM2)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--prompts-file", default=None, metavar="FILE.jsonl",
                   help="your own prompts instead of --datasets: one JSON value a line, a "
                        'string, {"prompt": str} or {"turns": [str, ...]} (chat template '
                        "applied, as for the sets)")
    p.add_argument("--split", default="all", choices=SPLITS,
                   help="which half of each set (fixed): 'tune' to choose settings on, "
                        "'heldout' to report speed on (default: all of it)")
    p.add_argument("--prompts", type=int, default=None,
                   help="conversations per set (default: the paper's whole subset)")
    p.add_argument("--max-tokens", type=int, default=256, help="new tokens per request")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature (offline runs; default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p when sampling")
    p.add_argument("--seed", type=int, default=0,
                   help="request i samples with seed SEED+i, so every method draws the same "
                        "random numbers and seeded PTD output equals plain output")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--ptd", nargs="+", default=["{}"], metavar="[LABEL=]JSON",
                   help="PTD configs, one row each (default: '{}', PTD's defaults for the platform)")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1],
                   help="requests (or server clients) at once; 1 is batch 1, e.g. 1 4 16 32")
    p.add_argument("--interleave", action="store_true",
                   help="keep every method's engine alive (in-process) and run each workload "
                        "with all methods back to back: ratios robust to a shared machine's "
                        "slow spells (not with --sweep)")
    p.add_argument("--repeat", action="store_true",
                   help="with --interleave: after each workload, run it again at once with "
                        "every cache kept (prefix cache, suffix's responses, PTD's shared "
                        "outputs): rows '<set>, repeated'")
    p.add_argument("--multiprocess", action="store_true",
                   help="with --interleave: vLLM's default multiprocess engine cores (what "
                        "`LLM` and `vllm serve` run) instead of in-process ones")
    p.add_argument("--compile", action="store_true",
                   help="let vLLM compile / capture graphs (default: enforce_eager)")
    p.add_argument("--sweep", action="store_true",
                   help="also sweep PTD's width and depth (Figure 6), batch 1")
    p.add_argument("--sweep-dataset", default=None, choices=DATASETS,
                   help="set for the sweep (default: the first of --datasets)")
    p.add_argument("--widths", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--depths", nargs="+", type=int, default=[2, 4, 6, 8])
    p.add_argument("--server-url", default=None,
                   help="benchmark a running OpenAI-compatible server instead (e.g. .../v1)")
    p.add_argument("--server-model", default=None, help="served model name (default: first)")
    p.add_argument("--label", default="server", help="the server run's row label ('plain' "
                   "for the plain server whose results.json later serves as --reference)")
    p.add_argument("--reference", default=None,
                   help="results.json of a plain server run: speedups and mismatches")
    p.add_argument("--out", default=None, help="output folder (default: benchmarks/results/"
                   "<date-time>)")
    p.add_argument("--save-outputs", action="store_true", help="keep token ids in the JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--smoke", action="store_true",
                   help="CI check: 2 conversations per set, 16 tokens, plain + ptd, float32")
    return p


def apply_smoke(args: argparse.Namespace) -> None:
    """Small enough for two shared CPU cores in a few minutes, still end to end."""
    args.prompts, args.max_tokens, args.dtype = 2, 16, "float32"
    args.concurrency, args.sweep = [1], False
    if not args.server_url:
        args.methods = ["plain", "ptd"]
