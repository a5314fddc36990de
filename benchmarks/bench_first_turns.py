"""Batch-1 tokens/s on single questions (MT-Bench first turns, GSM8K, ...), every engine alive
in one process and taking turns per request, so the ratios to plain are same-time ratios.

    python benchmarks/bench_first_turns.py --datasets mt_bench gsm8k --prompts 10 \
        --methods ptd ngram suffix
    # several PTD configs, on questions 10-39 (not the first ten):
    python benchmarks/bench_first_turns.py --datasets mt_bench --prompts 30 --offset 10 \
        --methods ptd --ptd 'f12={"adaptive_budget":0,"max_nodes":12,"max_candidate_nodes":8}' \
        'f15={"adaptive_budget":0,"max_nodes":15,"max_candidate_nodes":10}'

`vllm-ptd bench` asks MT-Bench's second turns too; this asks the first question of each
conversation only. Each cell: tokens/s, speedup over plain and tokens per step (DE; for vLLM's
drafters from the engine's own spec-decode counters, for PTD from its worker counters).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _ptd_configs(specs: list[str]) -> dict[str, dict]:
    """`name=JSON` items (a bare JSON object is named "ptd")."""
    configs = {}
    for spec in specs:
        name, _, text = spec.partition("=") if not spec.lstrip().startswith("{") else ("", "", spec)
        configs[name or "ptd"] = json.loads(text)
    return configs


def _engines(methods: list[str], ptd: dict[str, dict]):
    from ptd_bench.methods import NGRAM_SPEC, SUFFIX_SPEC  # the configs the bench compares

    from vllm_ptd.engine_utils import make_llm

    specs = {"ngram": NGRAM_SPEC, "suffix": SUFFIX_SPEC}
    engines = {"plain": make_llm(None, dtype="bfloat16", enforce_eager=True)}
    # vLLM 0.32's module scan fails for engines started after numba (ngram) is loaded.
    for method in sorted(methods, key=lambda m: m == "ngram"):
        if method == "ptd":
            for name, config in ptd.items():
                engines[name] = make_llm(None, ptd=config, dtype="bfloat16", enforce_eager=True)
        else:
            engines[method] = make_llm(None, dtype="bfloat16", enforce_eager=True,
                                       speculative_config=specs[method])
    return engines


def _counters(engines: dict, ptd: dict) -> dict:
    from ptd_bench.counters import read_ptd, read_vllm

    return {name: (read_ptd(llm) if name in ptd else read_vllm(llm))
            for name, llm in engines.items() if name != "plain"}


def _tokens_per_step(name: str, before: dict, after: dict, ptd: dict, tokens: int,
                     requests: int) -> float | None:
    from ptd_bench.counters import ptd_metrics, vllm_metrics

    if name in ptd:
        return ptd_metrics(before[name], after[name])["DE"]
    return vllm_metrics(before[name], after[name], tokens, requests)["DE"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "gsm8k"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--offset", type=int, default=0,
                        help="skip this many questions of each set first")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["ptd", "ngram"],
                        choices=["ptd", "ngram", "suffix"])
    parser.add_argument("--ptd", nargs="+", default=["{}"],
                        help="PTD configs: JSON, or name=JSON for several")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts

    ptd = _ptd_configs(args.ptd) if "ptd" in args.methods else {}
    engines = _engines(args.methods, ptd)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    warm = SamplingParams(temperature=0, max_tokens=8)
    print("| set | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for dataset in args.datasets:
        questions = sample_prompts(dataset, args.offset + args.prompts)[args.offset:]
        prompts = chat_prompts(engines["plain"], questions)
        for llm in engines.values():
            llm.generate(["Say hello."], warm, use_tqdm=False)
        before = _counters(engines, ptd)
        tokens = dict.fromkeys(engines, 0)
        seconds = dict.fromkeys(engines, 0.0)
        for prompt in prompts:
            for name, llm in engines.items():
                start = time.perf_counter()
                out = llm.generate([prompt], params, use_tqdm=False)
                seconds[name] += time.perf_counter() - start
                tokens[name] += len(out[0].outputs[0].token_ids)
        after = _counters(engines, ptd)
        rate = {name: tokens[name] / seconds[name] for name in engines}
        cells = []
        for name in engines:
            cell = f"{rate[name]:.1f} tok/s ({rate[name] / rate['plain']:.2f}x"
            if name != "plain":
                de = _tokens_per_step(name, before, after, ptd, tokens[name], len(prompts))
                cell += f", DE {de:.2f}" if de is not None else ""
            cells.append(cell + ")")
        print(f"| {dataset} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
