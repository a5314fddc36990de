"""Offline runs: one engine per method, each workload answered `concurrency` conversations at
a time (1 = the paper's batch-1 setting), timed around `llm.generate` only."""

from __future__ import annotations

import time

from tqdm import tqdm

from . import counters
from .methods import Method
from .outputs import compare
from .workloads import Workload, chunks, messages_for


def build_engine(method: Method, model: str | None, dtype: str, max_num_seqs: int,
                 max_model_len: int, enforce_eager: bool):
    from vllm_ptd.engine_utils import make_llm

    return make_llm(model, ptd=method.ptd, dtype=dtype, speculative_config=method.spec,
                    max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                    enforce_eager=enforce_eager)


def warm_up(llm) -> None:
    """One short untimed request: the first step pays one-off costs (graphs, allocators).
    Not a benchmark prompt, so no cache remembers part of a timed answer."""
    from vllm import SamplingParams

    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                     add_generation_prompt=True)
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)


def reset_caches(llm, method: Method) -> None:
    """Every timed run starts cold: the same prompts run once per concurrency level, and
    prefix caching (all methods), suffix decoding's response cache or PTD's shared outputs
    would otherwise replay the previous run. (What the engines learned, such as PTD's cost
    and acceptance models, stays: a served engine keeps it too.)"""
    llm.reset_prefix_cache()
    if method.kind == "suffix":
        from .worker_rpc import reset_suffix_cache

        llm.collective_rpc(reset_suffix_cache)
    elif method.kind == "ptd":
        from .worker_rpc import reset_ptd_shared_outputs

        llm.collective_rpc(reset_ptd_shared_outputs)


def _read(llm, method: Method) -> dict | None:
    if method.kind == "ptd":
        return counters.read_ptd(llm)
    if method.kind in ("ngram", "suffix"):
        return counters.read_vllm(llm)
    return None


def ask_turns(llm, convs: list, groups, params_for):
    """Answers conversations group by group, each group's turn t in one `generate` call after
    its turn t-1 answers (which become part of turn t's chat). Yields (turn, indexes, outputs,
    seconds in `generate`) per call; params_for(i, turn) gives a request's SamplingParams."""
    tok = llm.get_tokenizer()
    answers: list[list[str]] = [[] for _ in convs]
    for group in groups:
        for turn in range(max(len(convs[i]) for i in group)):
            idx = [i for i in group if turn < len(convs[i])]
            prompts = [tok.apply_chat_template(messages_for(convs[i], answers[i]),
                                               tokenize=False, add_generation_prompt=True)
                       for i in idx]
            start = time.perf_counter()
            outs = llm.generate(prompts, [params_for(i, turn) for i in idx], use_tqdm=False)
            elapsed = time.perf_counter() - start
            for i, out in zip(idx, outs):
                answers[i].append(out.outputs[0].text)
            yield turn, idx, outs, elapsed


def run_workload(llm, method: Method, workload: Workload, concurrency: int, max_tokens: int,
                 reference: list[list[int]] | None = None, progress: bool = True,
                 sampling: dict | None = None) -> tuple[dict, list[list[int]]]:
    """Answer every conversation of `workload`; returns (row, token ids per request in
    conversation/turn order). Turn t+1 of a conversation is asked after its turn-t answer.

    sampling: SamplingParams keywords (default greedy); a "seed" becomes seed + the
    request's index, the same for every method."""
    steps = iter_workload(llm, method, workload, concurrency, max_tokens, reference, progress,
                          sampling)
    for result in steps:
        if result is not None:
            return result
    raise AssertionError("iter_workload ended without a result")


def iter_workload(llm, method: Method, workload: Workload, concurrency: int, max_tokens: int,
                  reference: list[list[int]] | None = None, progress: bool = True,
                  sampling: dict | None = None, cold: bool = True):
    """`run_workload` one `generate` call at a time: yields None after each call and the
    (row, outputs) result last, so that several methods can take turns (`--interleave`).
    cold=False keeps what the caches hold from the previous run (`--repeat`)."""
    from vllm import SamplingParams

    if cold:
        reset_caches(llm, method)
    sampling = dict(sampling or {"temperature": 0.0})
    seed = sampling.pop("seed", None)

    def params_for(i: int, turn: int) -> SamplingParams:
        per_request = {} if seed is None else {"seed": seed + 1000 * i + turn}
        return SamplingParams(max_tokens=max_tokens, **sampling, **per_request)

    convs = workload.conversations
    ids: dict[tuple[int, int], list[int]] = {}
    before, seconds = _read(llm, method), 0.0
    bar = tqdm(total=workload.num_requests, unit="req", leave=False, disable=not progress,
               desc=f"{method.label} | {workload.dataset} | c={concurrency}")
    groups = chunks(list(range(len(convs))), concurrency)
    for turn, idx, outs, elapsed in ask_turns(llm, convs, groups, params_for):
        seconds += elapsed
        for i, out in zip(idx, outs):
            ids[(i, turn)] = list(out.outputs[0].token_ids)
        bar.update(len(idx))
        yield None
    bar.close()
    outputs = [ids[(i, t)] for i in range(len(convs)) for t in range(len(convs[i]))]
    tokens = sum(map(len, outputs))
    after = _read(llm, method)
    if method.kind == "ptd":
        metrics = counters.ptd_metrics(before, after)
    elif before is not None:
        metrics = counters.vllm_metrics(before, after, tokens, len(outputs))
    else:
        metrics = counters.plain_metrics()
    row = {"mode": "offline", "method": method.label, "kind": method.kind,
           "dataset": workload.dataset, "concurrency": concurrency, "requests": len(outputs),
           "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
           **metrics, **compare(outputs, reference, workload)}
    yield row, outputs
