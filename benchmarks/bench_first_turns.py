"""Batch-1 tokens/s on single questions (MT-Bench first turns, GSM8K, ...), every engine alive
in one process and taking turns per request, so the ratios to plain are same-time ratios.

    python benchmarks/bench_first_turns.py --datasets mt_bench gsm8k --prompts 10 \
        --methods ptd ngram suffix
    # several PTD configs, on questions 10-39 (not the first ten):
    python benchmarks/bench_first_turns.py --datasets mt_bench --prompts 30 --offset 10 \
        --methods ptd --ptd 'f12={"adaptive_budget":false,"max_nodes":12,"max_candidate_nodes":8}' \
        'f15={"adaptive_budget":false,"max_nodes":15,"max_candidate_nodes":10}'

`vllm-ptd bench` asks MT-Bench's second turns too; this asks the first question of each
conversation only. Each cell: tokens/s, speedup over plain and tokens per step (DE; for vLLM's
drafters from the engine's own spec-decode counters, for PTD from its worker counters).
"""

from __future__ import annotations

import argparse
import os
import time


def _engines(methods: list[str], ptd_configs: list[str]) -> dict:
    """Label -> (method, engine), with the configs `vllm-ptd bench` compares."""
    from ptd_bench.methods import build_methods

    from vllm_ptd.engine_utils import make_llm

    # vLLM 0.32's module scan fails for engines started after numba (ngram) is loaded.
    chosen = sorted(build_methods(["plain", *methods], ptd_configs),
                    key=lambda m: m.kind == "ngram")
    return {m.label: (m, make_llm(None, ptd=m.ptd, dtype="bfloat16", enforce_eager=True,
                                  speculative_config=m.spec)) for m in chosen}


def _counters(engines: dict) -> dict:
    from ptd_bench.counters import read_ptd, read_vllm

    return {label: (read_ptd(llm) if method.kind == "ptd" else read_vllm(llm))
            for label, (method, llm) in engines.items() if method.kind != "plain"}


def _tokens_per_step(method, before: dict, after: dict, tokens: int, requests: int
                     ) -> float | None:
    from ptd_bench.counters import ptd_metrics, vllm_metrics

    if method.kind == "ptd":
        return ptd_metrics(before, after)["DE"]
    return vllm_metrics(before, after, tokens, requests)["DE"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "gsm8k"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--offset", type=int, default=0,
                        help="skip this many questions of each set first")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["ptd", "ngram"],
                        choices=["ptd", "ngram", "suffix"], help="compared with plain")
    parser.add_argument("--ptd", nargs="+", default=["{}"], metavar="[LABEL=]JSON",
                        help="PTD configs, one column each (as in `vllm-ptd bench`)")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts

    engines = _engines(args.methods, args.ptd)
    plain = engines["plain"][1]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    warm = SamplingParams(temperature=0, max_tokens=8)
    print("| set | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for dataset in args.datasets:
        questions = sample_prompts(dataset, args.offset + args.prompts)[args.offset:]
        prompts = chat_prompts(plain, questions)
        for _, llm in engines.values():
            llm.generate(["Say hello."], warm, use_tqdm=False)
        before = _counters(engines)
        tokens = dict.fromkeys(engines, 0)
        seconds = dict.fromkeys(engines, 0.0)
        for prompt in prompts:
            for label, (_, llm) in engines.items():
                start = time.perf_counter()
                out = llm.generate([prompt], params, use_tqdm=False)
                seconds[label] += time.perf_counter() - start
                tokens[label] += len(out[0].outputs[0].token_ids)
        after = _counters(engines)
        rate = {label: tokens[label] / seconds[label] for label in engines}
        cells = []
        for label, (method, _) in engines.items():
            cell = f"{rate[label]:.1f} tok/s ({rate[label] / rate['plain']:.2f}x"
            if method.kind != "plain":
                de = _tokens_per_step(method, before[label], after[label], tokens[label],
                                      len(prompts))
                cell += f", DE {de:.2f}" if de is not None else ""
            cells.append(cell + ")")
        print(f"| {dataset} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
