"""Replay PTD's chains and vLLM's suffix drafter on the answers an engine actually gave when
the same prompts came twice under load (bf16: the second answers drift from the first), not
on the first answers repeated exactly. Reads a `vllm-ptd bench --repeat --save-outputs`
results.json; each method's own two passes are replayed (its first pass fills the caches).

Usage (repository root): python THIS RESULTS.json SPLIT PROMPTS [N]"""
import json, subprocess, sys
sys.path.insert(0, "benchmarks")
import replay_drafting as rd
from ptd_bench.workloads import REPEATED, load_workload, messages_for
from transformers import AutoTokenizer

results, split, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3])
N = int(sys.argv[4]) if len(sys.argv) > 4 else 32
tok = AutoTokenizer.from_pretrained(subprocess.check_output(["vllm-ptd", "model-path"], text=True).strip())
rows = json.load(open(results))["rows"]


def traces_of(row, convs):
    """{prompt, output} per request, in conversation / turn order, prompts rebuilt as the
    benchmark built them (later turns after the method's own earlier answers)."""
    outs, out = iter(row["outputs"]), []
    for conv in convs:
        answers = []
        for _ in conv:
            ids = next(outs)
            text = tok.apply_chat_template(messages_for(conv, answers), tokenize=False,
                                           add_generation_prompt=True)
            out.append({"prompt": tok(text)["input_ids"], "output": ids})
            answers.append(tok.decode(ids, skip_special_tokens=True))
    return out


def same_prefix(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


cost = rd.StepCost(13.2, 0.4, 1.8)
load = (N, rd.LOADED_LINES_MS[N])
print("| set | method's answers | drifted | engine DE first / repeated | replay suffix first / repeated | replay PTD first / repeated | PTD repeated, no drift | PTD in lock-step first / repeated |")
print("|---|---|---|---|---|---|---|---|")
for ds in dict.fromkeys(r["dataset"].removesuffix(REPEATED) for r in rows):
    convs = load_workload(ds, prompts, split=split).conversations
    for method in ("plain", "suffix", "ptd"):
        cold = next(r for r in rows if r["dataset"] == ds and r["method"] == method)
        warm = next(r for r in rows if r["dataset"] == ds + REPEATED and r["method"] == method)
        first, second = traces_of(cold, convs), traces_of(warm, convs)
        if ds == "mt_bench":   # as the engine asks them: every first turn, then the second
            first, second = first[0::2] + first[1::2], second[0::2] + second[1::2]
        drifted = sum(a["output"] != b["output"] for a, b in zip(first, second))
        kept = sum(same_prefix(a["output"], b["output"]) for a, b in zip(first, second))
        total = sum(len(a["output"]) for a in first)
        sx = rd.replay_first_and_repeated(first, None, cost, repeated=second)
        pt = rd.replay_first_and_repeated(first, {}, cost, load=load, repeated=second)
        exact = rd.replay_first_and_repeated(first, {}, cost, load=load)
        lock = rd.replay_first_and_repeated(first, {}, cost, load=load, repeated=second,
                                            concurrency=N)
        de = lambda r: r.get("DE", r.get("acceptance_length", float("nan")))
        print(f"| {ds} | {method} | {drifted}/{len(first)} ({kept / total:.0%} before drift) | "
              f"{de(cold):.2f} / {de(warm):.2f} | {sx[0]:.2f} / {sx[2]:.2f} | "
              f"{pt[0]:.2f} / {pt[2]:.2f} | {exact[2]:.2f} | {lock[0]:.2f} / {lock[2]:.2f} |", flush=True)
