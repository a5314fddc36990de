"""What a drafted step costs per step, per drafting request and per row, at a fixed load.

PTD chains run with the adaptive budget's cut replaced by random drafting patterns: each
step a random share of the batch drafts (none in a third of the steps), each drafting request
a random number of its chain's rows. Every decode step's period is then regressed on

    a + j * (anything drafted) + c * drafting requests + b * draft rows

overall and per engine stage (inputs, forward, logits, sample, propose, update), at the
batch size the run holds (`--concurrency`). The budget's own cost model
(`core/step_cost.py`) has no `j`: whatever a step pays once anything drafts is read as part of
`c`, in proportion to how many requests draft. Outputs are plain decoding's (the drafts are
verified as always); only the drafts' lengths are random.

In-process engine core (the stages can only be timed in this process); by default vLLM then
runs the model on every core, whereas its default multiprocess engine on a 2-core machine
binds the model to one core and leaves the other to the front end.

    python benchmarks/step_cost_patterns.py --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import defaultdict
from types import SimpleNamespace

STAGES = ("inputs", "forward", "logits", "sample", "propose", "update")


def randomise_chains(seed: int) -> None:
    """Each chain step: a random share of the batch drafts, each a random number of rows."""
    from vllm_ptd.core import budget

    rng = random.Random(seed)
    share = [1.0]
    choose = budget.BudgetPolicy.choose

    def random_share(self, num_requests, num_drafting):
        share[0] = rng.choice([0.0, 0.0, 0.1, 0.25, 0.5, 1.0])
        return choose(self, num_requests, num_drafting)

    def random_length(self, classes):
        if rng.random() >= share[0]:
            return 0
        return min(len(classes), rng.choice([1, 2, 4, 8, 15]))

    budget.BudgetPolicy.choose = random_share
    budget.BudgetPolicy.chain_length = random_length


def record_steps(log: list[dict]) -> None:
    """Append one dict per engine step: requests, draft rows, drafting requests, prompt
    tokens, period (from one schedule call to the next) and seconds per stage (timed by
    step_costs.py's wrappers)."""
    from step_costs import instrument  # beside this script
    from vllm.v1.core.sched.scheduler import Scheduler

    clock = SimpleNamespace(active=True, seconds=defaultdict(float), steps=0)
    instrument(lambda: clock)
    previous: dict = {}
    schedule = Scheduler.schedule

    def schedule_and_mark(self, *args, **kwargs):
        now = time.perf_counter()
        out = schedule(self, *args, **kwargs)
        spec = out.scheduled_spec_decode_tokens
        requests = len(out.num_scheduled_tokens)
        rows = sum(map(len, spec.values()))
        if previous:
            log.append({**previous, "seconds": now - previous.pop("start"), **clock.seconds})
        clock.seconds.clear()
        previous.clear()
        previous.update(start=now, requests=requests, rows=rows,
                        drafting=sum(1 for drafts in spec.values() if drafts),
                        prompt=out.total_num_scheduled_tokens - requests - rows)
        return out

    Scheduler.schedule = schedule_and_mark


def fit(steps: list[dict], requests: int) -> dict:
    """Least squares of each step's period and stages on (1, any drafted, drafting, rows)
    over the decode steps that held `requests` requests (ms)."""
    import numpy as np

    kept = [s for s in steps if s["prompt"] == 0 and s["requests"] == requests]
    periods = np.array([s["seconds"] for s in kept])
    kept = [s for s, p in zip(kept, periods) if p < 3 * np.median(periods)]   # idle gaps
    drafting = np.array([s["drafting"] for s in kept], dtype=float)
    x = np.stack([np.ones(len(kept)), drafting > 0, drafting,
                  np.array([s["rows"] for s in kept], dtype=float)], axis=1)
    out = {"steps": len(kept), "steps_without_drafts": int((drafting == 0).sum())}
    for name in ("seconds", *STAGES):
        y = np.array([s.get(name, 0.0) for s in kept]) * 1e3
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        out["step" if name == "seconds" else name] = dict(zip(("a", "j", "c", "b"),
                                                             map(float, coef)))
    return out


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16, help="requests at once")
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--split", default="tune")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts in all (default: 3 x --concurrency)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None, help="write the fit and every step as JSON")
    args = p.parse_args()

    from vllm import SamplingParams

    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts, make_llm

    randomise_chains(args.seed)
    llm = make_llm(ptd={"draft_shape": "chain"}, dtype=args.dtype,
                   max_num_seqs=args.concurrency)
    steps: list[dict] = []
    record_steps(steps)
    prompts = chat_prompts(llm, sample_prompts(args.dataset, args.prompts or 3 * args.concurrency,
                                               split=args.split))
    llm.generate(["Say hello."], SamplingParams(max_tokens=8), use_tqdm=False)   # warm-up
    steps.clear()
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
                 use_tqdm=False)
    result = fit(steps, args.concurrency)
    print(f"{args.concurrency} requests at once, {result['steps']} decode steps "
          f"({result['steps_without_drafts']} without drafts); ms: a (step), j (once anything "
          f"drafts), c (per drafting request), b (per draft row)")
    for name in ("step", *STAGES):
        f = result[name]
        print(f"  {name:8s} a {f['a']:7.2f}  j {f['j']:6.2f}  c {f['c']:6.2f}  b {f['b']:6.3f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "fit": result, "steps": steps}, fh, indent=1)


if __name__ == "__main__":
    main()
