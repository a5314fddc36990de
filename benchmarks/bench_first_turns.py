"""Batch-1 tokens/s on single questions (MT-Bench first turns, GSM8K, ...), every engine alive
in one process and taking turns per request, so the ratios to plain are same-time ratios.

    python benchmarks/bench_first_turns.py --datasets mt_bench gsm8k --prompts 10 \
        --methods ptd ngram --ptd '{}'

`vllm-ptd bench` asks MT-Bench's second turns too; this asks the first question of each
conversation only. Tokens/s only (with several engines in one process vLLM's metrics
registry holds only the last engine's counters).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _engines(methods: list[str], ptd: dict):
    from ptd_bench.methods import NGRAM_SPEC, SUFFIX_SPEC  # the configs the bench compares

    from vllm_ptd.engine_utils import make_llm

    specs = {"ngram": NGRAM_SPEC, "suffix": SUFFIX_SPEC}
    # vLLM 0.32's module scan fails for engines started after numba (ngram) is loaded.
    order = ["plain"] + sorted(methods, key=lambda m: m == "ngram")
    return {m: make_llm(None, ptd=ptd if m == "ptd" else None, dtype="bfloat16",
                        enforce_eager=True, speculative_config=specs.get(m)) for m in order}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "gsm8k"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["ptd", "ngram"],
                        choices=["ptd", "ngram", "suffix"])
    parser.add_argument("--ptd", default="{}", help="PTD config (JSON)")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts

    engines = _engines(args.methods, json.loads(args.ptd))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    warm = SamplingParams(temperature=0, max_tokens=8)
    print("| set | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for dataset in args.datasets:
        prompts = chat_prompts(engines["plain"], sample_prompts(dataset, args.prompts))
        for llm in engines.values():
            llm.generate(["Say hello."], warm, use_tqdm=False)
        tokens = dict.fromkeys(engines, 0)
        seconds = dict.fromkeys(engines, 0.0)
        for prompt in prompts:
            for name, llm in engines.items():
                start = time.perf_counter()
                out = llm.generate([prompt], params, use_tqdm=False)
                seconds[name] += time.perf_counter() - start
                tokens[name] += len(out[0].outputs[0].token_ids)
        rate = {name: tokens[name] / seconds[name] for name in engines}
        cells = [f"{rate[n]:.1f} tok/s ({rate[n] / rate['plain']:.2f}x)" for n in engines]
        print(f"| {dataset} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
