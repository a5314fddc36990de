"""Plain vLLM vs vLLM's `ngram` vs PTD, side by side in one run, on the embedded model (or any
HF model): tokens/s, speedup over plain, tokens per target step, greedy mismatches vs plain.

    .venv/bin/python benchmarks/bench_vllm_methods.py --datasets mt_bench gsm8k \
        --prompts 5 --max-tokens 128 --dtype bfloat16 --batch 1

Timings on shared machines are noisy: read the speedup column (same run, same machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import time


def _methods(ptd_configs: list[str]) -> list[tuple[str, dict | None, dict | None]]:
    out = [("plain", None, None),
           ("ngram k=4", None, {"method": "ngram", "num_speculative_tokens": 4,
                                "prompt_lookup_max": 4, "prompt_lookup_min": 2})]
    for text in ptd_configs:
        cfg = json.loads(text)
        out.append((f"ptd {text}" if cfg else "ptd", cfg, None))
    return out


def run(args) -> list[dict]:
    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import accepted_tokens, chat_prompts, make_llm

    rows, reference = [], {}
    for name, ptd, other_spec in _methods(args.ptd):
        llm = make_llm(args.model, ptd=ptd, dtype=args.dtype, enforce_eager=args.eager,
                       speculative_config=other_spec)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        for dataset in args.datasets:
            prompts = chat_prompts(llm, sample_prompts(dataset, args.prompts))
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
            accepted0, start, outputs = accepted_tokens(llm), time.perf_counter(), []
            for i in range(0, len(prompts), args.batch):
                outs = llm.generate(prompts[i:i + args.batch], params, use_tqdm=False)
                outputs += [list(o.outputs[0].token_ids) for o in outs]
            elapsed = time.perf_counter() - start
            tokens = sum(map(len, outputs))
            accepted = accepted_tokens(llm) - accepted0
            ref = reference.setdefault(dataset, outputs)
            rows.append({
                "method": name, "dataset": dataset, "tokens": tokens, "seconds": elapsed,
                "tokens_per_s": tokens / elapsed, "tokens_per_step": tokens / (tokens - accepted),
                "mismatches": sum(a != b for a, b in zip(outputs, ref)),
            })
            print(json.dumps(rows[-1]), flush=True)
        del llm
        gc.collect()
    plain = {r["dataset"]: r["tokens_per_s"] for r in rows if r["method"] == "plain"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / plain[r["dataset"]]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--datasets", nargs="+", default=["mt_bench", "gsm8k"])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="enforce_eager for every engine")
    parser.add_argument("--ptd", nargs="*", default=["{}"],
                        help="PTD configs as JSON objects, e.g. '{\"max_nodes\": 24}'")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = run(args)
    print("\n| method | dataset | tokens/s | speedup | tokens/step | mismatches |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['dataset']} | {r['tokens_per_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | {r['mismatches']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
