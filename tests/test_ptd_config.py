"""`{"method": "ptd", ...}` is validated before the engine starts, with messages naming the key."""

from __future__ import annotations

import pytest

from vllm_ptd.config import AUTO, CHAIN, CPU_DEFAULTS, TREE
from vllm_ptd.vllm_integration.spec_config import split_speculative_dict


def test_defaults_are_the_papers():
    cfg = split_speculative_dict({"method": "ptd"})
    assert (cfg.width, cfg.depth, cfg.num_roots, cfg.pool_cap) == (4, 6, 4, 60)


def test_platform_defaults_fill_only_keys_the_user_did_not_set():
    cfg = split_speculative_dict({"method": "ptd"}, defaults=CPU_DEFAULTS)
    assert (cfg.draft_shape, cfg.max_nodes) == (AUTO, 15)
    cfg = split_speculative_dict({"method": "ptd", "draft-shape": "tree"}, defaults=CPU_DEFAULTS)
    assert (cfg.draft_shape, cfg.max_nodes) == (TREE, 15)
    assert split_speculative_dict({"method": "ptd", "draft_shape": 0},
                                  defaults=CPU_DEFAULTS).draft_shape == TREE


def test_enumerations_by_name_and_old_integers():
    cfg = split_speculative_dict({"method": "ptd", "draft_shape": "chain",
                                  "adaptive-budget": False})
    assert (cfg.draft_shape, cfg.adaptive_budget) == (CHAIN, False)
    cfg = split_speculative_dict({"method": "ptd", "draft_shape": 1, "adaptive_budget": 0})
    assert (cfg.draft_shape, cfg.adaptive_budget) == (CHAIN, False)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"method": "ptd", "widht": 4}, "widht"),
        ({"method": "ptd", "width": 0}, "width"),
        ({"method": "ptd", "depth": "6"}, "depth"),
        ({"method": "ptd", "max_nodes": -1}, "max_nodes"),
        ({"method": "ptd", "num_speculative_tokens": 5}, "num_speculative_tokens"),
        ({"method": "ptd", "pool_cap": True}, "pool_cap"),
        ({"method": "ptd", "draft_shape": "bush"}, "'draft_shape' must be one of 'tree', 'chain'"),
        ({"method": "ptd", "adaptive_budget": "yes"}, "'adaptive_budget' must be true or false"),
    ],
)
def test_bad_keys_are_refused_by_name(spec, needle):
    with pytest.raises(ValueError, match=needle):
        split_speculative_dict(spec)


def _engine_config(spec):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_ptd.model import default_model_path
    from vllm_ptd.plugin import register

    register()
    args = EngineArgs(model=default_model_path(), speculative_config=spec, max_model_len=512)
    return args.create_engine_config()


def test_engine_args_map_ptd_onto_the_custom_class_path():
    config = _engine_config({"method": "ptd", "width": 2, "max_nodes": 24})
    spec = config.speculative_config
    assert spec.method == "custom_class"
    assert spec.model == "vllm_ptd.vllm_integration.proposer.PTDProposer"
    assert spec.num_speculative_tokens == 24
    assert spec.ptd["width"] == 2


def test_engine_args_refuse_a_bad_ptd_key_before_the_engine_starts():
    with pytest.raises(ValueError, match="depth"):
        _engine_config({"method": "ptd", "depth": 1000})


@pytest.mark.parametrize("key, value", [
    ("rejection_sample_method", "fly"),          # vLLM 0.33's lossy FLy window
    ("fly_window_size", 3),
    ("rejection_sample_method", "synthetic"),
    ("synthetic_acceptance_length", 2.5),
])
def test_vllm_verification_options_are_refused_since_ptd_verifies_exactly(key, value):
    with pytest.raises(ValueError, match=f"{key}.*verifies exactly"):
        split_speculative_dict({"method": "ptd", key: value})


def test_the_v2_model_runner_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER"):
        _engine_config({"method": "ptd"})
