"""Where a decoding step's time goes, per method: plain, vLLM's suffix and ngram, PTD chains and
PTD trees, on the same prompts, taking turns prompt by prompt (interleaved, greedy; batch 1, or
`--concurrency` prompts at once).

Every method runs in this process with vLLM's in-process engine core, so each stage of a
step can be timed by wrapping vLLM's own functions (wall clock, no profiler):

- schedule: `Scheduler.schedule`
- inputs: `GPUModelRunner._prepare_inputs` (PTD: with the step's trees built)
- attn metadata: `GPUModelRunner._build_attention_metadata`
- forward: `GPUModelRunner._model_forward` (all layers, draft rows included)
- logits: `LogitsProcessor.forward`
- sample: `GPUModelRunner._sample` (verification, rejection sampling)
- propose: `GPUModelRunner.propose_draft_token_ids` (the next step's drafts)
- update: `Scheduler.update_from_output`
- other: the rest of the engine-core step (output processing, bookkeeping)

It prints ms per step for each stage, draft rows and tokens per step, and ms per token, and
writes them to --out as JSON. Multiprocess engines (what users run) cannot be timed this way;
`vllm-ptd bench --interleave --multiprocess` measures their tokens/s.

    python benchmarks/step_costs.py --split tune --prompts 4 --max-tokens 128 \\
        --methods plain suffix ptd_chain ptd_tree
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

STAGES = ("schedule", "inputs", "attn metadata", "forward", "logits", "sample", "propose",
          "update")
METHOD_SPECS = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2},
    "suffix": {"method": "suffix"},
    "ptd_chain": {"method": "ptd", "draft_shape": "chain"},
    "ptd_tree": {"method": "ptd", "draft_shape": "tree"},
    "ptd_auto": {"method": "ptd", "draft_shape": "auto"},
}


def instrument(clock_of):
    """Wrap vLLM's classes once; `clock_of()` is the run whose engine steps now (None or
    inactive: untimed). Nested calls of one stage are not expected (none of these recurse)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core_client import InprocClient
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    targets = [(Scheduler, "schedule", "schedule"),
               (GPUModelRunner, "_prepare_inputs", "inputs"),
               (GPUModelRunner, "_build_attention_metadata", "attn metadata"),
               (GPUModelRunner, "_model_forward", "forward"),
               (LogitsProcessor, "forward", "logits"),
               (GPUModelRunner, "_sample", "sample"),
               (GPUModelRunner, "propose_draft_token_ids", "propose"),
               (Scheduler, "update_from_output", "update"),
               # the engine core's step and post-step, as LLM.generate calls them
               (InprocClient, "get_output", "step")]
    for owner, name, stage in targets:
        original = getattr(owner, name)

        def make(original, stage):
            def timed(*args, **kwargs):
                clock = clock_of()
                if clock is None or not clock.active:
                    return original(*args, **kwargs)
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    clock.seconds[stage] += time.perf_counter() - start
                    if stage == "forward":
                        clock.steps += 1
            return timed

        setattr(owner, name, make(original, stage))


class MethodRun:
    def __init__(self, name: str, llm) -> None:
        self.name, self.llm = name, llm
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.tokens = 0
        self.wall = 0.0
        self.active = False


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["plain", "suffix", "ptd_chain", "ptd_tree"],
                   choices=list(METHOD_SPECS))
    p.add_argument("--ptd", default="{}", help="extra PTD config (JSON) for ptd_* methods")
    p.add_argument("--datasets", nargs="+", default=["mt_bench", "gsm8k", "humaneval", "mbpp"])
    p.add_argument("--split", default="tune")
    p.add_argument("--prompts", type=int, default=4, help="per set")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=1,
                   help="prompts given to each generate call at once (1: batch 1)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts, make_llm

    runs = []
    for name in args.methods:
        spec = METHOD_SPECS[name]
        if spec is not None and spec["method"] == "ptd":
            extra = {k: v for k, v in spec.items() if k != "method"}
            llm = make_llm(ptd={**extra, **json.loads(args.ptd)}, dtype=args.dtype)
        else:
            llm = make_llm(speculative_config=spec, dtype=args.dtype)
        runs.append(MethodRun(name, llm))
    # After the engines exist: PTD's runner patches are applied when its engine starts,
    # and the clocks must wrap them, not be replaced by them.
    current: list[MethodRun | None] = [None]
    instrument(lambda: current[0])
    questions = [q for d in args.datasets
                 for q in sample_prompts(d, args.prompts, split=args.split)]
    prompts = chat_prompts(runs[0].llm, questions)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for run in runs:   # warm-up, untimed, not a benchmark prompt
        run.llm.generate(["Say hello."], SamplingParams(max_tokens=8), use_tqdm=False)
    groups = [prompts[i:i + args.concurrency] for i in range(0, len(prompts), args.concurrency)]
    for i, group in enumerate(groups):
        order = runs if i % 2 == 0 else runs[::-1]   # who goes first alternates
        for run in order:
            current[0] = run
            run.active = True
            start = time.perf_counter()
            outs = run.llm.generate(group, greedy, use_tqdm=False)
            run.wall += time.perf_counter() - start
            run.active = False
            run.tokens += sum(len(out.outputs[0].token_ids) for out in outs)
        print(f"group {i + 1}/{len(groups)}", flush=True)
    table = {}
    for run in runs:
        per_step = {stage: 1e3 * run.seconds[stage] / run.steps for stage in STAGES}
        per_step["other"] = (1e3 * run.seconds["step"] / run.steps) - sum(per_step.values())
        per_step["step"] = 1e3 * run.seconds["step"] / run.steps
        table[run.name] = {"ms_per_step": per_step, "steps": run.steps, "tokens": run.tokens,
                           "tokens_per_step": run.tokens / run.steps,   # over the batch
                           "ms_per_token": 1e3 * run.wall / run.tokens,
                           "tokens_per_s": run.tokens / run.wall}
    plain = table.get("plain")
    cols = [*STAGES, "other", "step"]
    print("\n| method | " + " | ".join(cols) + " | tokens/step | ms/token | x plain |")
    print("|---" * (len(cols) + 4) + "|")
    for name, row in table.items():
        speed = (row["tokens_per_s"] / plain["tokens_per_s"]) if plain else float("nan")
        print(f"| {name} | " + " | ".join(f"{row['ms_per_step'][c]:.2f}" for c in cols)
              + f" | {row['tokens_per_step']:.2f} | {row['ms_per_token']:.2f} | {speed:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
