"""Replay greedy outputs offline to compare chain drafting configs with suffix decoding.

With greedy decoding a draft row is accepted exactly when it equals the output's next token,
so a drafter's proposals and acceptances on a recorded output need no model: this replays
PTD's chain drafting (`PTDRequestState` and the chain policy of core/budget.py, its cost
model fed a fixed step-cost line) and vLLM's suffix drafter (Arctic Inference's cache, the
settings of `{"method": "suffix"}`) over the same outputs, in seconds. Tokens per step are
exact for the replayed outputs; tokens/s are modelled with the step-cost line
(a + b * tokens + c per drafting request), measured on the engine (`--step-ms`).

    python benchmarks/replay_drafting.py --traces /tmp/first_turns.json \
        --ptd 'default={}' 'no_shared={"shared_outputs":0}'

Without the traces file, the plain engine generates it first (bf16, batch of all prompts of
a set). What replay cannot show: the argmax at rows after the first rejected one (the
pool's feedback there is left out), timing noise, and anything batch-dependent.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

import numpy as np

# Measured on 2 cores of an AMD EPYC Zen 5 (AVX-512, bf16), embedded model: a plain step,
# each extra token, each drafting request (verification, sampler and drafting glue).
DEFAULT_STEP_MS = (13.2, 0.4, 1.8)


def generate_traces(path: str, datasets: list[str], prompts: int, offset: int,
                    max_tokens: int, split: str) -> dict:
    """Greedy outputs of every turn of the sets' conversations (MT-Bench's second turns
    asked after the model's own first answers, as `vllm-ptd bench` asks them), in the order
    the benchmark answers them at batch 1: a conversation's turns one after the other."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from ptd_bench.offline import ask_turns  # beside this script
    from ptd_bench.workloads import load_workload
    from vllm import SamplingParams

    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(None, dtype="bfloat16", enforce_eager=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    traces = {}
    for dataset in datasets:
        convs = load_workload(dataset, offset + prompts, split=split).conversations[offset:]
        per_turn: dict[tuple[int, int], dict] = {}
        every_conversation = [list(range(len(convs)))]
        for turn, idx, outs, _ in ask_turns(llm, convs, every_conversation, lambda i, t: params):
            for i, out in zip(idx, outs):
                per_turn[(i, turn)] = {"prompt": list(out.prompt_token_ids),
                                       "output": list(out.outputs[0].token_ids)}
        traces[dataset] = [per_turn[key] for key in sorted(per_turn)]
    with open(path, "w") as f:
        json.dump(traces, f)
    return traces


class StepCost:
    def __init__(self, a_ms: float, b_ms: float, c_ms: float):
        self.a, self.b, self.c = a_ms / 1e3, b_ms / 1e3, c_ms / 1e3

    def seconds(self, rows: int) -> float:
        return self.a + self.b * (1 + rows) + (self.c if rows else 0.0)


def _accepted(chain: list[int], output: list[int], pos: int) -> int:
    k = 0
    while k < len(chain) and pos + k < len(output) and chain[k] == output[pos + k]:
        k += 1
    return k


# Step-cost lines of a loaded step measured in the engine (ms: per step, per token, per
# drafting request), by requests at once: the prices `load` replays at.
LOADED_LINES_MS = {1: (13.2, 0.4, 1.8), 4: (33.0, 0.42, 1.0), 16: (40.0, 0.36, 0.3),
                   32: (50.0, 0.31, 0.2)}


def price_as_loaded(policy, requests: int, line_ms: tuple[float, float, float]) -> None:
    """Teach `policy`'s cost model a step of `requests` requests on `line_ms` (random
    drafting patterns, as a busy engine sees them), then freeze it; every step is then
    chosen for `requests` requests, so one replayed request meets a busy batch's prices."""
    a_ms, b_ms, c_ms = line_ms
    rng = np.random.default_rng(0)
    for _ in range(400):
        drafting = int(rng.integers(0, requests + 1))
        rows = int(rng.integers(0, 5)) * drafting
        policy.cost.observe(requests + rows,
                            (a_ms + b_ms * (requests + rows) + c_ms * drafting) / 1e3, drafting)
    policy.cost.observe = lambda *args, **kwargs: None


def replay_first_and_repeated(traces: list[dict], overrides: dict | None, cost: StepCost,
                              load: tuple | None = None, repeated: list[dict] | None = None,
                              concurrency: int | None = None
                              ) -> tuple[float, float, float, float]:
    """(DE, rows per step) of a first pass over `traces` and of the same prompts again after
    it, the second pass's figures recovered from a replay of both passes.

    repeated: the second pass's outputs where they differ from the first's (an engine's
    bf16 answers drift between passes), in the order of `traces`; default: the same.
    overrides None replays vLLM's suffix drafter (`replay_suffix`) instead of PTD's chains.
    concurrency: as `replay_ptd`'s."""
    second = traces if repeated is None else repeated

    if concurrency is not None:   # a group never spans the two passes
        concurrency = min(concurrency, len(traces))

    def replay(passes: list[dict]) -> dict:
        if overrides is None:
            return replay_suffix(passes, cost)
        return replay_ptd(passes, overrides, cost, load=load, concurrency=concurrency)

    first, both = replay(traces), replay(traces + second)
    decode_steps = lambda ts: sum(len(t["output"]) - 1 for t in ts)
    steps1 = decode_steps(traces) / first["DE"]
    steps_both = (decode_steps(traces) + decode_steps(second)) / both["DE"]
    steps2 = steps_both - steps1
    rows2 = (both["rows"] * steps_both - first["rows"] * steps1) / steps2
    return first["DE"], first["rows"], decode_steps(second) / steps2, rows2


@dataclass
class _ReplayedRequest:
    """One request of a replayed group: its recorded output and how far it has got."""

    output: list[int]
    state: object                  # PTDRequestState
    committed: list[int] = field(default_factory=list)   # the last step's tokens
    pos: int = 1                   # the next output position to decode
    layout: object = None          # this step's draft (TreeLayout)
    accepted: int = 0              # its rows accepted

    def __post_init__(self) -> None:
        self.committed = self.output[:1]   # the first token comes from prefill


def replay_ptd(traces: list[dict], overrides: dict, cost: StepCost,
               headroom: dict | None = None, load: tuple | None = None,
               concurrency: int | None = None, online_cost: bool = False) -> dict:
    """Chains (the CPU defaults, then `overrides`) over every output of one set in turn.

    concurrency: requests answered at once, in lock-step (each group of that many drafts
    from the outputs of the groups before it only, and the policy prices each step for the
    requests still running); None: one after another, each priced as `load`'s batch.

    load: (requests at once, step-cost line in ms) to price rows as a loaded step does
    (`price_as_loaded`); None prices them by `cost` at batch 1.

    online_cost: at batch 1, also feed the cost model every replayed step's time, as the
    engine does, so that what it fits follows the rows the policy chose (its ridge prior
    weighs more where those vary little); otherwise it learns the line once, from steps of
    0-8 rows, before the replay.

    headroom: if given, summed per step (see `HEADROOM`): the rows accepted of the chain
    that ran, of the chosen chain uncut, of each candidate chain uncut (the own context's,
    the shared outputs'), and of the better of the two (an oracle no drafter has)."""
    from vllm_ptd.config import CHAIN, CPU_DEFAULTS, PTDConfig
    from vllm_ptd.core.budget import BudgetPolicy
    from vllm_ptd.core.request_state import PTDRequestState
    from vllm_ptd.core.shared_outputs import SharedOutputs
    from vllm_ptd.core.verify import verify_greedy

    cfg = PTDConfig.from_dict({**CPU_DEFAULTS, "draft_shape": CHAIN, **overrides})
    if cfg.draft_shape != CHAIN:
        raise ValueError("replay covers chains only (draft_shape 'chain')")
    policy = BudgetPolicy(cfg.max_nodes, chain=True) if cfg.adaptive_budget else None
    batch = 1 if load is None else load[0]
    if policy is not None and load is not None:
        price_as_loaded(policy, *load)
    elif policy is not None:
        for n in range(400):   # the cost model learns the line, as it would online
            rows = n % 9
            policy.cost.observe(1 + rows, cost.seconds(rows), drafting=int(rows > 0))
    shared = (SharedOutputs(cfg.shared_outputs, cfg.context_ngram, cfg.context_min_ngram,
                           max_length=cfg.match_length)
              if cfg.shared_outputs and cfg.context_ngram else None)
    tokens = steps = rows_total = 0
    seconds = 0.0
    at_once = 1 if concurrency is None else concurrency
    for start in range(0, len(traces), at_once):
        # A group answered in lock-step, as a busy engine's batch: every request drafts,
        # then every one learns its verdict; finished outputs are shared when they finish.
        group = [_ReplayedRequest(t["output"], PTDRequestState(cfg, t["prompt"], frozenset(),
                                                               shared=shared))
                 for t in traces[start:start + at_once]]
        while group:
            if policy is not None:
                priced_for = batch if concurrency is None else len(group)
                policy.choose(priced_for, priced_for)
            for r in group:
                x = r.committed[-1]
                r.layout = r.state.propose(x, cfg.max_nodes, committed=r.committed,
                                           chain_policy=policy)
                r.accepted = _accepted(r.layout.tokens[1:].tolist(), r.output, r.pos)
                if headroom is not None:
                    _add_headroom(headroom, r.state, x, cfg, policy, r.output, r.pos,
                                  r.accepted)
            for r in group:
                rows, acc = len(r.layout) - 1, r.accepted
                committed = r.output[r.pos:r.pos + acc + 1]
                if rows:
                    ran = r.layout.truncate(acc + 1)   # argmax is known to the first rejection
                    argmax = np.array(committed + [0] * (acc + 1 - len(committed)),
                                      dtype=np.int64)
                    r.state.observe(ran, argmax, verify_greedy(ran, argmax))
                else:
                    r.state.observe_undrafted(r.committed[-1], committed)
                if policy is not None:
                    policy.record_chain(r.state.chain_classes if rows else (), rows, acc)
                    if online_cost and at_once == 1:
                        policy.cost.observe(1 + rows, cost.seconds(rows), drafting=int(rows > 0))
                r.committed, r.pos = committed, r.pos + len(committed)
                tokens += len(committed)
                steps += 1
                rows_total += rows
                seconds += cost.seconds(rows)
            for r in [r for r in group if r.pos >= len(r.output)]:
                group.remove(r)
                if shared is not None:
                    # as the proposer does: the prompt's tail first, so a repeated prompt
                    # matches
                    shared.add(r.state.output_tokens(),
                               r.state.prompt_tail(cfg.shared_prompt_tail))
    return {"DE": tokens / steps, "rows": rows_total / steps, "rate": tokens / seconds}


HEADROOM = ("ran", "chosen, uncut", "own context", "shared outputs", "better of the two")


def _add_headroom(sums: dict, state, x: int, cfg, policy, output: list[int], pos: int,
                  ran: int) -> None:
    from vllm_ptd.core.chain import candidate_chains, choose_chain

    trie = state.pool.tries.get(x)
    own, other, ngrams = candidate_chains(state.context, None if trie is None else trie.root,
                                          cfg.max_nodes, cfg.context_depth,
                                          cfg.context_matches, state.shared)
    chosen = choose_chain(own, other, ngrams, None if policy is None else policy.chain_value)
    own_acc = _accepted(own[0], output, pos)
    other_acc = 0 if other is None else _accepted(other[0], output, pos)
    for key, accepted in zip(HEADROOM, (ran, _accepted(chosen[0], output, pos), own_acc,
                                        other_acc, max(own_acc, other_acc))):
        sums[key] = sums.get(key, 0) + accepted
    sums["steps"] = sums.get("steps", 0) + 1


def replay_suffix(traces: list[dict], cost: StepCost, cached: bool = True) -> dict:
    """vLLM's suffix drafter with `{"method": "suffix"}`'s settings (tree depth 24, at most
    24 tokens, spec factor 1, min token prob 0.1); cached: earlier responses stay in its
    global tree (vLLM's default), else each request drafts from its own prompt and output."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    tokens = steps = rows_total = 0
    seconds = 0.0
    for i, trace in enumerate(traces):
        output, rid = trace["output"], f"r{i}"
        cache.start_request(rid, np.array(trace["prompt"], dtype=np.int32))
        history = list(trace["prompt"]) + output[:1]
        cache.add_active_response(rid, output[:1])
        pos = 1
        while pos < len(output):
            draft = cache.speculate(rid, np.array(history[-24:], dtype=np.int32),
                                    max_spec_tokens=24, max_spec_factor=1.0,
                                    min_token_prob=0.1)
            chain = list(draft.token_ids)
            committed = output[pos:pos + _accepted(chain, output, pos) + 1]
            cache.add_active_response(rid, committed)
            history += committed
            pos += len(committed)
            tokens += len(committed)
            steps += 1
            rows_total += len(chain)
            seconds += cost.seconds(len(chain))
        cache.stop_request(rid)
        if not cached:
            cache.evict_cached_response(rid)
    return {"DE": tokens / steps, "rows": rows_total / steps, "rate": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", required=True, help="JSON of greedy outputs (made if absent)")
    parser.add_argument("--datasets", nargs="+",
                        default=["mt_bench", "gsm8k", "humaneval", "mbpp"])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--split", default="tune", choices=("all", "tune", "heldout"),
                        help="half of each set the outputs are made from (datasets.SPLITS)")
    parser.add_argument("--offset", type=int, default=0, help="questions skipped first")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ptd", nargs="+", default=["default={}"], metavar="LABEL=JSON")
    parser.add_argument("--headroom", action="store_true",
                        help="also: rows accepted per step of the chain that ran, of the "
                        "candidates uncut, and of the better candidate (first --ptd config)")
    parser.add_argument("--step-ms", type=float, nargs=3, default=DEFAULT_STEP_MS,
                        metavar=("PLAIN", "PER_TOKEN", "PER_DRAFTING_REQUEST"))
    parser.add_argument("--online-cost", action="store_true",
                        help="PTD's cost model also learns from every replayed step, as in "
                        "the engine (default: it learns the line once, before the replay)")
    args = parser.parse_args()

    if os.path.exists(args.traces):
        with open(args.traces) as f:
            traces = json.load(f)
    else:
        traces = generate_traces(args.traces, args.datasets, args.prompts, args.offset,
                                 args.max_tokens, args.split)
    cost = StepCost(*args.step_ms)
    plain_rate = 1.0 / cost.seconds(0)
    configs = [(label, json.loads(spec)) for label, _, spec in
               (item.partition("=") for item in args.ptd)]
    columns = ["suffix", "suffix, own request only"] + [label for label, _ in configs]
    print("| set | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for dataset, set_traces in traces.items():
        results = [replay_suffix(set_traces, cost), replay_suffix(set_traces, cost, False)]
        results += [replay_ptd(set_traces, overrides, cost, online_cost=args.online_cost)
                    for _, overrides in configs]
        cells = [f"{r['rate'] / plain_rate:.2f}x (DE {r['DE']:.2f}, {r['rows']:.1f} rows)"
                 for r in results]
        print(f"| {dataset} | " + " | ".join(cells) + " |", flush=True)
    if args.headroom:
        label, overrides = configs[0]
        print(f"\nRows accepted per step, {label} (every decode step):\n")
        print("| set | " + " | ".join(HEADROOM) + " |")
        print("|---|" + "---|" * len(HEADROOM))
        for dataset, set_traces in traces.items():
            sums: dict = {}
            replay_ptd(set_traces, overrides, cost, headroom=sums)
            print(f"| {dataset} | " + " | ".join(f"{sums.get(key, 0) / sums['steps']:.3f}"
                                                  for key in HEADROOM) + " |", flush=True)


if __name__ == "__main__":
    main()
