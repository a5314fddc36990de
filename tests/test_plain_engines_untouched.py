"""With vllm-ptd installed, an engine that does not run PTD runs vLLM's own code: every wrapper
returns straight to vLLM's function, with the same arguments, writing nothing; and a vLLM the
plugin cannot patch still serves plain engines while PTD engines are refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vllm_ptd.vllm_integration import cuda_graphs, runner_patches, sampling_patches, spec_config


class PlainRunner:
    """A model runner of an engine without PTD (no drafter, or another method's) that fails
    the test on any attribute write."""

    def __init__(self, drafter=None) -> None:
        object.__setattr__(self, "drafter", drafter)

    def __setattr__(self, name, value):
        raise AssertionError(f"a PTD wrapper wrote runner.{name} in a plain engine")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "vllm's result"


RUNNER_WRAPPERS = {
    "_update_states": (runner_patches.make_update_states, ("scheduler_output",)),
    "_prepare_inputs": (runner_patches.make_prepare_inputs, ("scheduler_output", "counts")),
    "_build_attention_metadata": (runner_patches.make_build_attention_metadata,
                                  ("num_tokens", "num_reqs")),
    "_sample": (runner_patches.make_sample, ("logits", "spec_decode_metadata")),
    "_input_fits_in_drafter": (runner_patches.make_input_fits_in_drafter, ("metadata",)),
    "_check_and_update_cudagraph_mode": (cuda_graphs.make_check_and_update_cudagraph_mode,
                                         ("attention_backends", "kv_cache_groups")),
}


@pytest.mark.parametrize("name", sorted(RUNNER_WRAPPERS))
@pytest.mark.parametrize("drafter", [None, "an ngram proposer"])
def test_runner_wrappers_return_straight_to_vllm_for_plain_engines(name, drafter):
    make, args = RUNNER_WRAPPERS[name]
    original = Recorder()
    runner = PlainRunner(drafter)
    assert make(original)(runner, *args) == "vllm's result"
    assert original.calls == [((runner, *args), {})]


class SpecConfig:
    method = "ngram"


class VllmConfig:
    speculative_config = SpecConfig()


def test_sampling_wrappers_return_straight_to_vllm_for_plain_engines():
    original, config = Recorder(), VllmConfig()
    wrapped = sampling_patches.make_build_logitsprocs(original)
    assert wrapped(config, "cpu", False, False, ()) == "vllm's result"
    assert original.calls == [((config, "cpu", False, False, ()), {})]
    original, params, spec = Recorder(), object(), SpecConfig()
    assert sampling_patches.make_validate_spec_decode(original)(params, spec) == "vllm's result"
    assert original.calls == [((params, spec), {})]


class EngineArgs:
    def __init__(self) -> None:
        self.spec_method = None
        self.speculative_config = {"method": "ngram", "num_speculative_tokens": 3}


def test_speculative_config_wrapper_passes_other_methods_to_vllm_unchanged():
    original = Recorder()
    args = EngineArgs()
    assert spec_config.make_create_speculative_config(original)(args, "model", "parallel") == \
        "vllm's result"
    assert original.calls == [((args, "model", "parallel"), {})]
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}


UNKNOWN_VLLM_SCRIPT = textwrap.dedent("""
    import os, sys
    import vllm_ptd.version_check as version_check
    version_check.installed_vllm_version = lambda: "0.99.0"   # what the plugin sees
    from vllm import LLM, SamplingParams
    from vllm_ptd.patching import applied_patches
    kwargs = dict(dtype="float32", max_model_len=512, enforce_eager=True)
    llm = LLM(sys.argv[1], **kwargs)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    print("PLAIN TEXT:", repr(out[0].outputs[0].text))
    print("PATCHED:", sorted(p.key[1] for p in applied_patches()))
    try:
        LLM(sys.argv[1], speculative_config={"method": "ptd"}, **kwargs)
        print("PTD STARTED")
    except Exception as exc:
        print("PTD REFUSED:", exc)
""")


@pytest.mark.engine
def test_an_unknown_vllm_serves_plain_engines_and_refuses_ptd_by_version(tmp_path):
    from vllm_ptd.model import default_model_path

    script = tmp_path / "unknown_vllm.py"
    script.write_text(UNKNOWN_VLLM_SCRIPT)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_PTD_SKIP_VERSION_CHECK", None)
    out = subprocess.run([sys.executable, str(script), default_model_path()], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
             for line in out.stdout.splitlines() if ":" in line}
    assert len(eval(lines["PLAIN TEXT"])) > 5, log[-4000:]
    # Nothing of PTD's is patched: only the refusal of method 'ptd' itself.
    assert lines["PATCHED"] == "['EngineArgs.create_speculative_config']"
    assert "PTD STARTED" not in out.stdout
    assert "0.99.0" in lines["PTD REFUSED"] and "'ptd'" in lines["PTD REFUSED"]
    assert log.count("vllm-ptd is disabled") == 1   # one warning, in the one process
