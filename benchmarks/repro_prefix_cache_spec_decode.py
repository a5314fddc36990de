"""A defect of vLLM 0.32 (CPU build), not of PTD: speculative decoding with prefix caching gave
one seeded request (index 53) the token 0 as its first token when the same 128 prompts ran a
second and third time, with PTD's chains and trees and with vLLM's own `ngram` method alike;
plain decoding, and every method without prefix caching, gave the right tokens. Request 53's
prompt is request 117's prompt plus 117's output (prefix-cache blocks written during decoding
are reused by a prefill). The requests mirror tests/test_vllm_serve_soak.py.

    python benchmarks/repro_prefix_cache_spec_decode.py pc plain plain.json
    python benchmarks/repro_prefix_cache_spec_decode.py pc '{"method": "ngram", "num_speculative_tokens": 4}' ngram.json
    python benchmarks/repro_prefix_cache_spec_decode.py pc '{"method": "ptd", "draft_shape": "chain"}' ptd.json
    python benchmarks/repro_prefix_cache_spec_decode.py compare ptd.json plain.json

(first argument `pc`: prefix caching on, anything else: off). Seen 2026-12-02 on 2 cores.
"""

import json
import os
import random
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

def specs():
    from vllm_ptd.datasets import DATASETS, sample_prompts

    questions = [q for name in DATASETS for q in sample_prompts(name, 16)]
    rng = random.Random(23)
    out = []
    for i in range(128):
        question = questions[i % len(questions)]
        endpoint = "chat" if i % 2 == 0 else "completion"
        mt = rng.randint(4, 16)
        prompt = question if endpoint == "chat" else question[: rng.randint(40, max(41, len(question)))]
        kind = rng.choices(["greedy", "greedy_penalty", "seeded", "seeded_penalties", "unseeded"], weights=[40, 10, 25, 15, 10])[0]
        kw = {"max_tokens": mt}
        if kind.startswith("greedy"):
            kw["temperature"] = 0.0
            if kind == "greedy_penalty": kw["repetition_penalty"] = 1.2
        elif kind == "seeded": kw.update(temperature=0.9, seed=i)
        elif kind == "seeded_penalties": kw.update(temperature=0.8, top_p=0.9, presence_penalty=0.4, seed=i)
        else: kw["temperature"] = 1.0
        if rng.random() < 0.5 and rng.random() < 0.15:   # the soak's streaming draws
            rng.randint(1, 3)
        out.append((i, endpoint, prompt, kw, kind != "unseeded"))
    return out

def compare(got_path: str, plain_path: str) -> None:
    with open(got_path) as f, open(plain_path) as g:
        got, plain = json.load(f), json.load(g)
    for r in range(3):
        first_zero = [i for i in range(len(got["res"][r])) if got["res"][r][i][:1] == [0]]
        print(f"pass {r}: requests whose first token is 0: {first_zero}; plain: "
              f"{[i for i in range(len(plain['res'][r])) if plain['res'][r][i][:1] == [0]]}")


def main():
    mode = sys.argv[1]
    if mode == "compare":
        return compare(sys.argv[2], sys.argv[3])
    spec = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "plain" else None
    from vllm import LLM, SamplingParams

    from vllm_ptd.model import default_model_path

    llm = LLM(default_model_path(), dtype="float32", max_model_len=1024, enforce_eager=True,
              speculative_config=spec, enable_prefix_caching=(mode == "pc"), seed=0, max_num_seqs=16)
    tok = llm.get_tokenizer()
    S = specs()
    prompts = []
    for i, ep, p, kw, comp in S:
        if ep == "chat":
            p = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        prompts.append(p)
    params = [SamplingParams(**kw) for _, _, _, kw, _ in S]
    res = []
    for r in range(3):
        outs = llm.generate(prompts, params, use_tqdm=False)
        res.append([list(o.outputs[0].token_ids) for o in outs])
    with open(sys.argv[3], "w") as f:
        json.dump({"res": res, "comparable": [c for *_, c in S]}, f)

if __name__ == "__main__":
    main()
