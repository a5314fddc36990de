"""The Quick start demo: a few MT-Bench questions answered by plain vLLM and by PTD, one
request at a time, greedy; prints tokens/s, mean tokens per target step and output equality."""

from __future__ import annotations

import gc
import time


def _run(llm, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], float, int]:
    from vllm import SamplingParams

    from vllm_ptd.engine_utils import accepted_tokens

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    accepted_before = accepted_tokens(llm)
    outputs, start = [], time.perf_counter()
    for prompt in prompts:  # batch 1: the latency case speculative decoding is for
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        outputs.append(list(out.outputs[0].token_ids))
    elapsed = time.perf_counter() - start
    return outputs, elapsed, accepted_tokens(llm) - accepted_before


def run_demo(model: str | None, num_prompts: int, max_tokens: int, dtype: str) -> int:
    from vllm_ptd.datasets import sample_prompts
    from vllm_ptd.engine_utils import chat_prompts, make_llm

    questions = sample_prompts("mt_bench", num_prompts)
    rows = []
    plain_outputs = None
    for name, ptd in (("plain", None), ("ptd", {})):
        try:
            llm = make_llm(model, ptd=ptd, dtype=dtype)
        except Exception as exc:  # noqa: BLE001 (shown to the user, never hidden)
            print(f"\n[{name}] could not start: {type(exc).__name__}: {exc}")
            rows.append((name, None))
            continue
        prompts = chat_prompts(llm, questions)
        outputs, elapsed, accepted = _run(llm, prompts, max_tokens)
        del llm
        gc.collect()
        tokens = sum(len(o) for o in outputs)
        steps = tokens - accepted  # every target step commits one bonus token plus accepted drafts
        if plain_outputs is None:
            plain_outputs = outputs
        same = sum(a == b for a, b in zip(outputs, plain_outputs))
        rows.append((name, (tokens / elapsed, tokens / max(steps, 1), same, len(outputs))))

    print(f"\nMT-Bench, {num_prompts} questions, greedy, {max_tokens} max new tokens, "
          f"batch 1, dtype {dtype}")
    print(f"{'method':<8} {'tokens/s':>9} {'tokens/step':>12} {'identical to plain':>19}")
    for name, result in rows:
        if result is None:
            print(f"{name:<8} {'not available (see the error above)':>42}")
            continue
        tps, per_step, same, total = result
        print(f"{name:<8} {tps:>9.1f} {per_step:>12.2f} {f'{same}/{total}':>19}")
    if rows[-1][1] is not None and rows[0][1] is not None:
        print(f"speedup: {rows[-1][1][0] / rows[0][1][0]:.2f}x")
    return 0 if all(r is not None for _, r in rows[:1]) else 1
