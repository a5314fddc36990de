"""Bad input: PTD either refuses it with a clear error before the engine starts, or serves it
with exactly plain vLLM's output. Never an engine crash, never a hang, never leaked state.

Two parts:
- the config matrix (no engine): every PTD key with wrong types, out-of-range values and
  unknown / misspelt keys, through the path vLLM's `EngineArgs.create_engine_config` takes
  (which is also what `LLM(...)` and `vllm serve --speculative-config` call first);
- edge requests on one shared float32 PTD engine against one plain engine (marked `engine`):
  prompts at and near `max_model_len`, `max_tokens=1`, `min_tokens`, `ignore_eos`, requests
  whose stop string / stop token / max_tokens falls inside an accepted multi-token path, and
  `n > 1` with greedy sampling. After each: output identical to plain, the engine still
  serves, and PTD's per-request state is back to empty (`live_states == 0`).
"""

from __future__ import annotations

import gc
import itertools
import re
import time

import pytest
from engine_helpers import settled_live_states, snapshot

from vllm_ptd.config import PTD_CONFIG_KEYS

# ---------------------------------------------------------------------------------------------
# Config matrix: fails before the engine starts, naming the key (and the range).
# ---------------------------------------------------------------------------------------------

WRONG_TYPES = ["4", "", 4.0, 2.5, float("nan"), True, False, None, [4], {"value": 4}]


def _engine_config(spec: dict):
    """vLLM's own config path (EngineArgs -> create_engine_config); no engine is started."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_ptd.model import default_model_path
    from vllm_ptd.plugin import register

    register()
    args = EngineArgs(model=default_model_path(), speculative_config=spec, max_model_len=512)
    return args.create_engine_config()


INT_KEYS = sorted(k for k, spec in PTD_CONFIG_KEYS.items() if spec.kind is int)
NAMED_KEYS = sorted(k for k, spec in PTD_CONFIG_KEYS.items() if spec.kind is not int)


def _out_of_range_cases():
    for key in INT_KEYS:
        lo, hi = PTD_CONFIG_KEYS[key].lo, PTD_CONFIG_KEYS[key].hi
        for value in sorted({lo - 1, -1, hi + 1, 10**30}):
            if value < lo or value > hi:
                yield key, value, lo, hi


def _allowed_values(key):
    """Every value a key takes: both ends of an int range, each name or boolean and the old
    integer spellings, with what the config holds for it."""
    spec = PTD_CONFIG_KEYS[key]
    if spec.kind is int:
        return [(spec.lo, spec.lo), (spec.hi, spec.hi)]
    named = list(spec.choices) if spec.kind is str else [False, True]
    return [(v, v) for v in named] + list(spec.old.items())


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", WRONG_TYPES, ids=lambda v: f"{type(v).__name__}:{v!r}")
def test_every_key_refuses_a_wrong_type_naming_key_and_type(key, value):
    with pytest.raises(ValueError, match=rf"'{key}' must be of type int, got "
                                         rf"{type(value).__name__}"):
        _engine_config({"method": "ptd", key: value})


@pytest.mark.parametrize("key", NAMED_KEYS)
@pytest.mark.parametrize("value", [*WRONG_TYPES, 2, -1, "Tree", "CHAIN", "tree ", "1"],
                         ids=lambda v: f"{type(v).__name__}:{v!r}")
def test_every_named_key_refuses_other_values_naming_key_and_allowed_values(key, value):
    spec = PTD_CONFIG_KEYS[key]
    if spec.kind is bool and isinstance(value, bool):
        return   # true and false are this key's values
    shown = "one of 'tree', 'chain', 'auto'" if spec.kind is str else "true or false"
    with pytest.raises(ValueError, match=re.escape(f"'{key}' must be {shown} (or the old 0, 1)"
                                                   f", got {value!r}")):
        _engine_config({"method": "ptd", key: value})


@pytest.mark.parametrize(("key", "value", "lo", "hi"), list(_out_of_range_cases()))
def test_every_key_refuses_an_out_of_range_value_naming_key_and_range(key, value, lo, hi):
    with pytest.raises(ValueError, match=re.escape(f"'{key}' must be in [{lo}, {hi}], "
                                                   f"got {value}")):
        _engine_config({"method": "ptd", key: value})


@pytest.mark.parametrize("key", sorted(PTD_CONFIG_KEYS))
def test_every_key_takes_every_value_it_allows(key):
    for value, held in _allowed_values(key):
        spec = {"method": "ptd", key: value}
        if key == "context_min_ngram":  # must not exceed context_ngram (checked below)
            spec["context_ngram"] = PTD_CONFIG_KEYS["context_ngram"].hi
        config = _engine_config(spec).speculative_config
        assert config.ptd[key] == held and type(config.ptd[key]) is type(held)
        assert config.num_speculative_tokens == max(config.ptd["max_nodes"], 1)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"widht": 4}, "'widht' is not supported"),
        ({"Width": 4}, "'Width' is not supported"),
        ({"max-nodez": 4}, "'max-nodez' is not supported"),  # named as the user spelled it
        ({"": 4}, "'' is not supported"),
        ({"num_speculative_tokens": 5}, "'num_speculative_tokens' is not supported"),
        ({"model": "x"}, "'model' is not supported"),
        ({"prompt_lookup_max": 4}, "'prompt_lookup_max' is not supported"),
        ({7: 4}, "keys must be strings, got 7"),
        ({"max_nodes": 8, "max-nodes": 8}, "'max_nodes' is given twice"),
        ({"context_ngram": 2, "context_min_ngram": 3},
         r"'context_min_ngram' must be at most context_ngram \(2\), got 3"),
    ],
    ids=str,
)
def test_unknown_duplicate_and_inconsistent_keys_are_refused_by_name(spec, needle):
    with pytest.raises(ValueError, match=needle):
        _engine_config({"method": "ptd", **spec})


def test_dash_spelled_keys_are_the_same_keys():
    config = _engine_config({"method": "ptd", "max-nodes": 20, "num-roots": 2})
    assert (config.speculative_config.ptd["max_nodes"],
            config.speculative_config.ptd["num_roots"]) == (20, 2)


@pytest.mark.parametrize(("ptd", "needle"),
                         [({"depth": 2.0}, "'depth' must be of type int"),
                          ({"pool-cap": -5}, "'pool_cap' must be in"),
                          ({"wdith": 4}, "'wdith' is not supported")], ids=str)
def test_llm_refuses_bad_ptd_config_before_any_engine_process_starts(ptd, needle):
    """Through `LLM(...)` itself: the error comes from argument validation, within seconds,
    and no engine process was ever spawned."""
    import psutil

    from vllm_ptd.engine_utils import make_llm

    me = psutil.Process()
    children = {p.pid for p in me.children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(ValueError, match=needle):
        make_llm(ptd=ptd)
    assert time.monotonic() - started < 30
    assert {p.pid for p in me.children(recursive=True)} - children == set()


# ---------------------------------------------------------------------------------------------
# Edge requests on a running engine: PTD output == plain output, and the engine survives.
# ---------------------------------------------------------------------------------------------

MAX_LEN = 512
_ids = itertools.count()


@pytest.fixture(scope="module")
def plain_llm():
    from vllm_ptd.engine_utils import make_llm

    llm = make_llm(ptd=None, max_model_len=MAX_LEN, max_num_seqs=16)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def ptd_llm():
    from vllm_ptd.engine_utils import make_llm

    # Fixed budget: these cases need trees (paths accepted up to max_model_len, requests
    # ending inside an accepted path) whatever the adaptive budget would pick.
    llm = make_llm(ptd={"adaptive_budget": False, "draft_shape": "tree"}, max_model_len=MAX_LEN,
                   max_num_seqs=16)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tok(ptd_llm):
    return ptd_llm.get_tokenizer()


def _chat(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


def _summary(request_output) -> list[tuple]:
    """Everything a client sees of one request: per completion its tokens, text and why it
    finished."""
    return [(tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason)
            for c in sorted(request_output.outputs, key=lambda c: c.index)]


def _both(ptd_llm, plain_llm, prompts, params) -> tuple[list, list]:
    got = [_summary(o) for o in ptd_llm.generate(prompts, params, use_tqdm=False)]
    want = [_summary(o) for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    return got, want


def _assert_idle_and_serving(ptd_llm, plain_llm, tok):
    """No per-request PTD state is left, no PTD fallback happened, and a normal request still
    gets plain output."""
    from vllm import SamplingParams

    assert settled_live_states(ptd_llm) == 0
    assert snapshot(ptd_llm)["fallbacks"] == 0
    got, want = _both(ptd_llm, plain_llm, [_chat(tok, "Name three colors.")],
                      SamplingParams(temperature=0.0, max_tokens=24))
    assert got == want and len(want[0][0][0]) > 0
    assert settled_live_states(ptd_llm) == 0


def _long_token_rows(tok) -> list[list[int]]:
    """Token rows of more than MAX_LEN tokens: natural code, and a strongly repetitive list
    (PTD drafts long paths there, so trees meet the max_model_len limit)."""
    from vllm_ptd.datasets import sample_prompts

    code = "\n\n".join(sample_prompts("humaneval", 12))
    listing = "".join(f"item {i}: apple, banana, cherry, plum.\n" for i in range(200))
    rows = [tok(text, add_special_tokens=False).input_ids for text in (code, listing)]
    assert all(len(r) > 2 * MAX_LEN for r in rows)
    return rows


@pytest.mark.engine
def test_prompts_at_and_near_max_model_len(ptd_llm, plain_llm, tok):
    """Prompts within 24 tokens (PTD's CPU node budget) of max_model_len: every tree is cut
    to the room left before max_model_len (by PTD's budget, then by vLLM's scheduler, which
    keeps a prefix of the drafts)."""
    from vllm import SamplingParams

    rows = _long_token_rows(tok)
    lengths = (MAX_LEN - 1, MAX_LEN - 2, MAX_LEN - 3, MAX_LEN - 7, MAX_LEN - 12, MAX_LEN - 23)
    prompts = [{"prompt_token_ids": row[:n]} for row in rows for n in lengths]
    before = snapshot(ptd_llm)
    # max_tokens unset: vLLM generates up to max_model_len; 64: asks for more than fits.
    for params in (SamplingParams(temperature=0.0, max_tokens=None),
                   SamplingParams(temperature=0.0, max_tokens=64)):
        for batch in (prompts, prompts[:1], prompts[-1:]):
            got, want = _both(ptd_llm, plain_llm, batch, params)
            assert got == want
            for prompt, out in zip(batch, want):
                tokens, _text, reason, _ = out[0]
                assert len(prompt["prompt_token_ids"]) + len(tokens) <= MAX_LEN
                if reason == "length":
                    assert len(prompt["prompt_token_ids"]) + len(tokens) == MAX_LEN
    after = snapshot(ptd_llm)
    # PTD drafted right up to the limit, and paths were accepted there
    assert after["drafted_steps"] > before["drafted_steps"]
    assert after["tokens"] - before["tokens"] > after["steps"] - before["steps"]
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


@pytest.mark.engine
def test_prompts_too_long_or_empty_get_vllms_error_and_the_engine_survives(
        ptd_llm, plain_llm, tok):
    from vllm import SamplingParams

    row = _long_token_rows(tok)[0]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    cases = [
        ([{"prompt_token_ids": row[:MAX_LEN]}], "maximum (model|context) length"),
        ([{"prompt_token_ids": row[:MAX_LEN + 1]}], "maximum (model|context) length"),
        ([{"prompt_token_ids": row[:2 * MAX_LEN]}], "maximum (model|context) length"),
        ([""], "cannot be empty"),
        # a good request and a bad one in one call: the call fails, nothing is left behind
        ([_chat(tok, "Say hello."), {"prompt_token_ids": row[:MAX_LEN + 5]}],
         "maximum (model|context) length"),
    ]
    for prompts, needle in cases:
        errors = []
        for llm in (ptd_llm, plain_llm):
            with pytest.raises(Exception, match=needle) as info:
                llm.generate(prompts, params, use_tqdm=False)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]
        assert not ptd_llm.llm_engine.has_unfinished_requests()
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


QUESTIONS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the square of a number.",
    "List the first ten even numbers, separated by commas.",
    "What is the capital of France? Answer in one word.",
    "Count from 1 to 20.",
    "Translate 'good morning' into French.",
    "What is 2 + 2?",
    "Say hi.",
]


@pytest.mark.engine
def test_max_tokens_1(ptd_llm, plain_llm, tok):
    from vllm import SamplingParams

    prompts = [_chat(tok, q) for q in QUESTIONS]
    got, want = _both(ptd_llm, plain_llm, prompts, SamplingParams(temperature=0.0, max_tokens=1))
    assert got == want
    assert all(len(o[0][0]) == 1 and o[0][2] == "length" for o in want)
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


@pytest.fixture(scope="module")
def short_answer_prompts(plain_llm, tok):
    """Chat prompts whose plain greedy answer ends (EOS) in fewer than 20 tokens."""
    from vllm import SamplingParams

    prompts = [_chat(tok, q) for q in QUESTIONS]
    outs = plain_llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64),
                              use_tqdm=False)
    short = [p for p, o in zip(prompts, outs)
             if o.outputs[0].finish_reason == "stop" and len(o.outputs[0].token_ids) < 20]
    assert len(short) >= 2, "need prompts whose greedy answer ends early"
    return short


@pytest.mark.engine
def test_min_tokens_past_an_early_end(ptd_llm, plain_llm, tok, short_answer_prompts):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=20)
    got, want = _both(ptd_llm, plain_llm, short_answer_prompts, params)
    assert got == want
    assert all(len(o[0][0]) >= 20 for o in want)
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


@pytest.mark.engine
def test_ignore_eos_generates_past_the_end(ptd_llm, plain_llm, tok, short_answer_prompts):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    got, want = _both(ptd_llm, plain_llm, short_answer_prompts, params)
    assert got == want
    assert all(len(o[0][0]) == 64 and o[0][2] == "length" for o in want)
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


def _trace(llm, prompt, params) -> tuple[list[int], list[int]]:
    """Run one request alone, step by step: its output tokens and how many tokens each engine
    step committed."""
    engine = llm.llm_engine
    rid = f"trace-{next(_ids)}"
    engine.add_request(rid, prompt, params)
    sizes, seen, tokens = [], 0, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id != rid:
                continue
            tokens = list(out.outputs[0].token_ids)
            if len(tokens) > seen:
                sizes.append(len(tokens) - seen)
                seen = len(tokens)
    return tokens, sizes


@pytest.mark.engine
def test_requests_that_end_inside_an_accepted_path(ptd_llm, plain_llm, tok):
    """Find output positions PTD commits in the middle of a multi-token step, then end
    requests exactly there by max_tokens, a stop token id and a stop string. The tokens PTD
    committed past the end must be dropped exactly as plain decoding never produced them."""
    from vllm import SamplingParams

    eos = tok.eos_token_id
    prompts = [_chat(tok, "Repeat this list three times: red, green, blue, yellow, "
                          "purple, orange."),
               _chat(tok, "Count from 1 to 30, separated by commas.")]
    cases = []
    for prompt in prompts:
        tokens, sizes = _trace(ptd_llm, prompt, SamplingParams(temperature=0.0, max_tokens=96))
        ends = list(itertools.accumulate(sizes))
        # k: an output index committed in a step of >= 3 tokens, not the step's last one.
        inside = [k for end, size in zip(ends, sizes) if size >= 3
                  for k in range(end - size, end - 1) if k >= 1]
        assert inside, f"no multi-token step to end inside (steps {sizes})"
        k = inside[len(inside) // 2]
        cases.append((prompt, SamplingParams(temperature=0.0, max_tokens=k + 1)))
        stop_ids = [k for k in inside if tokens[k] not in tokens[:k] and tokens[k] != eos]
        if stop_ids:
            k = stop_ids[0]
            cases.append((prompt, SamplingParams(temperature=0.0, max_tokens=96,
                                                 stop_token_ids=[tokens[k]])))
        for k in inside:
            piece = tok.decode(tokens[k:k + 1]).strip()
            if piece and piece not in tok.decode(tokens[:k]):
                cases.append((prompt, SamplingParams(temperature=0.0, max_tokens=96,
                                                     stop=[piece])))
                break
    kinds = {("max_tokens" if p.max_tokens < 96 else "stop_token_ids" if p.stop_token_ids
              else "stop") for _, p in cases}
    assert kinds == {"max_tokens", "stop_token_ids", "stop"}, kinds
    for prompt, params in cases:
        got, _ = _trace(ptd_llm, prompt, params)
        want = plain_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        assert got == list(want.token_ids), params
        if params.max_tokens < 96:
            assert len(got) == params.max_tokens
        else:
            assert want.finish_reason == "stop"
    got, want = _both(ptd_llm, plain_llm, [p for p, _ in cases], [s for _, s in cases])
    assert got == want
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


@pytest.mark.engine
def test_n_greater_than_one(ptd_llm, plain_llm, tok):
    """vLLM refuses n > 1 with temperature 0 itself (SamplingParams: "n must be 1 when using
    greedy sampling"), before any engine sees it. The greedy-equivalent form is n > 1 with
    top_p=1e-6 (only the most likely token survives): every completion is the argmax path, so
    all must equal plain greedy output. (Not top_k=1: vLLM 0.32's CPU rejection sampler
    crashes on top_k in a step that verifies drafts, with ngram as well.)"""
    from vllm import SamplingParams

    with pytest.raises(Exception, match="n must be 1 when using greedy sampling"):
        SamplingParams(n=3, temperature=0.0, max_tokens=32)
    prompts = [_chat(tok, q) for q in QUESTIONS[:4]]
    params = SamplingParams(n=3, temperature=1.0, top_p=1e-6, seed=0, max_tokens=32)
    got, want = _both(ptd_llm, plain_llm, prompts, params)
    assert got == want
    greedy, _ = _both(ptd_llm, plain_llm, prompts, SamplingParams(temperature=0.0,
                                                                  max_tokens=32))
    assert [[c[:3] for c in o] for o in want] == [[g[0][:3]] * 3 for g in greedy]
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)


# Once crashed the engine: vLLM's batch-wide drafter check (GPUModelRunner.
# _input_fits_in_drafter) scheduled zeros in place of PTD's trees and PTD raised on the stale
# layout. PTD now keeps drafting there (patch in patches.py); last in the module regardless.
@pytest.mark.engine
def test_a_request_that_crosses_the_drafter_limit_mid_flight(ptd_llm, plain_llm, tok):
    """A 450-token prompt asking for 64 tokens (max_model_len 512): PTD drafts at first, then
    the sequence comes within num_speculative_tokens of max_model_len."""
    from vllm import SamplingParams

    rows = _long_token_rows(tok)
    prompts = [{"prompt_token_ids": rows[1][:450]}, {"prompt_token_ids": rows[0][:440]}]
    params = SamplingParams(temperature=0.0, max_tokens=64)
    want = [_summary(o) for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    for batch in ([0], [1], [0, 1]):
        before = snapshot(ptd_llm)
        got = [_summary(o) for o in ptd_llm.generate([prompts[i] for i in batch], params,
                                                     use_tqdm=False)]
        assert got == [want[i] for i in batch]
        assert snapshot(ptd_llm)["drafted_steps"] > before["drafted_steps"]  # PTD drafted
    _assert_idle_and_serving(ptd_llm, plain_llm, tok)
