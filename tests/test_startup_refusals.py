"""What PTD cannot serve exactly is refused before the engine serves a request, with a message
naming the feature (vllm_ptd/vllm_integration/startup_checks.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_ptd.vllm_integration import startup_checks as checks
from vllm_ptd.vllm_integration.spec_config import split_speculative_dict


def model(uses_mrope=False, window=None):
    return SimpleNamespace(uses_mrope=uses_mrope, get_sliding_window=lambda: window)


def args(kv_cache_dtype="auto", fuse_attn_quant=False):
    return SimpleNamespace(kv_cache_dtype=kv_cache_dtype, compilation_config=SimpleNamespace(
        pass_config=SimpleNamespace(fuse_attn_quant=fuse_attn_quant)))


PLAIN = SimpleNamespace(pipeline_parallel_size=1)


@pytest.mark.parametrize("engine_args, model_config, parallel, needle", [
    (args(), model(uses_mrope=True), PLAIN, "M-RoPE"),
    (args(), model(), SimpleNamespace(pipeline_parallel_size=2), "pipeline parallelism"),
    (args(), model(), SimpleNamespace(decode_context_parallel_size=2), "context parallelism"),
    (args(), model(), SimpleNamespace(prefill_context_parallel_size=2), "context parallelism"),
    (args(), model(), SimpleNamespace(enable_dbo=True), "dual batch overlap"),
    (args(), model(window=4096), PLAIN, "sliding-window attention"),
    (args(kv_cache_dtype="fp8_e4m3"), model(), PLAIN, "fp8 KV cache"),
    (args(fuse_attn_quant=True), model(), PLAIN, "fused attention output quantisation"),
])
def test_engine_level_features_are_refused_by_name(engine_args, model_config, parallel, needle):
    reasons = checks.engine_args_refusals(engine_args, model_config, parallel)
    with pytest.raises(checks.PTDUnsupportedEngine, match=needle):
        checks.refuse(reasons)
    assert len(reasons) == 1


def test_a_plain_engine_has_nothing_to_refuse():
    assert checks.engine_args_refusals(args(), model(), PLAIN) == []
    checks.refuse([])


def layer(**kw):
    return SimpleNamespace(**{"sliding_window": None, "has_sink": False,
                              "kv_sharing_target_layer_name": None, "kv_cache_dtype": "auto",
                              **kw})


@pytest.mark.parametrize("odd, needle", [
    ({"sliding_window": 512}, "sliding-window"),
    ({"has_sink": True}, "attention sinks"),
    ({"kv_sharing_target_layer_name": "layers.0.attn"}, "share another layer's KV cache"),
    ({"kv_cache_dtype": "fp8"}, "fp8 KV cache"),
    ({"impl": SimpleNamespace(alibi_slopes=[0.5], logits_soft_cap=None)}, "ALiBi"),
    ({"impl": SimpleNamespace(alibi_slopes=None, logits_soft_cap=30.0)}, "soft-capping"),
])
def test_attention_layers_ptd_cannot_serve_are_refused_when_the_model_loads(
        odd, needle, monkeypatch):
    from vllm_ptd.vllm_integration import proposer

    layers = {"layers.0.attn": layer(), "layers.1.attn": layer(**odd)}
    assert len(checks.attention_layer_refusals(layers)) == 1
    monkeypatch.setattr(proposer, "model_attention_layers", lambda vllm_config: layers)
    drafter = proposer.PTDProposer.__new__(proposer.PTDProposer)
    drafter.vllm_config = None
    with pytest.raises(checks.PTDUnsupportedEngine, match=needle):
        drafter.load_model(target_model=None)
    monkeypatch.setattr(proposer, "model_attention_layers", lambda vllm_config: {
        "layers.0.attn": layer()})
    drafter.load_model(target_model=None)


@pytest.mark.parametrize("key", ["max_nodes", "max_candidate_nodes"])
def test_budgets_above_what_vllms_rejection_sampler_verifies_are_refused(key):
    split_speculative_dict({"method": "ptd", key: 128})
    with pytest.raises(ValueError, match=key):
        split_speculative_dict({"method": "ptd", key: 129})


def _engine_config(**engine_kwargs):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_ptd.model import default_model_path
    from vllm_ptd.plugin import register

    register()
    return EngineArgs(model=default_model_path(), speculative_config={"method": "ptd"},
                      max_model_len=512, **engine_kwargs).create_engine_config()


def test_an_fp8_kv_cache_is_refused_before_the_engine_starts():
    with pytest.raises(ValueError, match="fp8 KV cache"):
        _engine_config(kv_cache_dtype="fp8")


def test_pipeline_parallelism_is_refused_before_the_engine_starts():
    with pytest.raises(ValueError, match="pipeline parallelism"):
        _engine_config(pipeline_parallel_size=2)


def _model_with_gemms(*kinds):
    """Linear layers as vLLM 0.32's CPU backend dispatches them (`cpu_linear` closures of
    `dispatch_cpu_unquantized_gemm`): oneDNN, the packed small-GEMM kernel, the fallback."""
    import torch

    ops = SimpleNamespace(onednn_mm=None, weight_packed_linear_cpu=None)
    closures = {
        "onednn": lambda x, weight, bias: ops.onednn_mm(None, x, bias),
        "packed": lambda x, weight, bias: ops.weight_packed_linear_cpu(x, None, 0, bias),
        "fallback": lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias),
    }
    root = torch.nn.Module()
    for i, kind in enumerate(kinds):
        layer = torch.nn.Module()
        layer.cpu_linear = closures[kind]
        root.add_module(f"layer{i}", layer)
    return root


def test_a_model_on_the_fallback_gemm_in_bf16_gets_a_warning_that_names_the_cure():
    import torch

    slow = _model_with_gemms("onednn", "fallback", "fallback", "packed")
    assert checks.fallback_gemm_layers(slow) == 2
    warning = checks.slow_gemm_warning(slow, torch.bfloat16)
    assert "2 linear layers" in warning and "bfloat16" in warning and "--dtype float32" in warning
    # float32 on the fallback is PyTorch's own fast path; oneDNN in bf16 is what vLLM wants
    assert checks.slow_gemm_warning(slow, torch.float32) is None
    assert checks.slow_gemm_warning(_model_with_gemms("onednn", "packed"), torch.bfloat16) is None
