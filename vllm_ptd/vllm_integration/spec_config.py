"""Turn `{"method": "ptd", ...}` into a vLLM 0.32 SpeculativeConfig.

vLLM's `SpeculativeConfig.method` is a closed Literal, so PTD rides on the `custom_class`
method (which also makes vLLM pick the V1 model runner and disable async scheduling, both
required here) with PTD's proposer as the class path. PTD's own keys are validated before
the engine starts and travel to every process as the `ptd` attribute of the config object.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from vllm_ptd.config import CPU_DEFAULTS, PTD_CONFIG_KEYS, PTDConfig
from vllm_ptd.vllm_integration.startup_checks import engine_args_refusals, refuse

PTD_METHOD = "ptd"
PROPOSER_CLASS_PATH = "vllm_ptd.vllm_integration.proposer.PTDProposer"


# vLLM's verification settings (0.32: standard, synthetic and block rejection sampling; 0.33
# adds FLy's lossy window): named in the refusal, since a user may expect them to apply.
VLLM_VERIFICATION_KEYS = frozenset({
    "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k",
    "enable_adaptive_verification", "draft_sample_method",
})


def split_speculative_dict(spec: dict[str, Any],
                           defaults: dict[str, Any] | None = None) -> PTDConfig:
    """Validate a user's speculative-config dict for PTD; return the PTD config.

    Keys may be spelled with '-' or '_' (``max-nodes`` is ``max_nodes``); `defaults` fills
    PTD keys the user did not set. Raises ValueError naming the offending key as the user
    spelled it: PTD keys are checked by PTDConfig, and vLLM keys other than `method` are
    refused because PTD sizes the speculation itself.
    """
    ptd_keys: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in spec.items():
        if not isinstance(key, str):
            raise ValueError(f"speculative-config keys must be strings, got {key!r}")  # noqa: TRY004
        name = key.replace("-", "_")
        if name == "method":
            continue
        if name in VLLM_VERIFICATION_KEYS:
            raise ValueError(
                f"speculative-config key {key!r} chooses vLLM's verification, which PTD "
                "replaces: PTD verifies exactly (greedy output equal to plain decoding, "
                "sampled output distributed as plain decoding's), with no lossy option"
            )
        if name not in PTD_CONFIG_KEYS:
            raise ValueError(
                f"speculative-config key {key!r} is not supported with method 'ptd'; "
                f"PTD keys are: {', '.join(sorted(PTD_CONFIG_KEYS))}"
            )
        if name in ptd_keys:
            raise ValueError(f"speculative-config key {name!r} is given twice "
                             f"(as {spelled[name]!r} and {key!r})")
        ptd_keys[name] = value
        spelled[name] = key
    for name, value in (defaults or {}).items():
        ptd_keys.setdefault(name, value)
    return PTDConfig.from_dict(ptd_keys)


def platform_budget_defaults() -> dict[str, Any]:
    """Defaults for keys a user did not set, chosen for the platform the engine runs on
    (`config.CPU_DEFAULTS` on CPU, the dataclass's elsewhere)."""
    from vllm.platforms import current_platform

    return dict(CPU_DEFAULTS) if current_platform.is_cpu() else {}


def ptd_config_of(speculative_config: Any) -> PTDConfig | None:
    """The PTD config attached to a vLLM SpeculativeConfig, or None when PTD is not in use."""
    if speculative_config is None:
        return None
    raw = getattr(speculative_config, "ptd", None)
    if raw is None:
        return None
    return PTDConfig.from_dict(raw)


def requests_ptd(engine_args: Any) -> bool:
    """Whether these engine arguments ask for method 'ptd' (`--spec-method` or the dict)."""
    spec = engine_args.speculative_config
    method = engine_args.spec_method or (spec.get("method") if isinstance(spec, dict) else None)
    return method == PTD_METHOD


def make_create_speculative_config(original):
    """Wrap `EngineArgs.create_speculative_config`: rewrite method 'ptd' before vLLM sees it."""

    def create_speculative_config(self, target_model_config, target_parallel_config):
        if not requests_ptd(self):
            return original(self, target_model_config, target_parallel_config)
        spec = dict(self.speculative_config or {})
        spec.setdefault("method", PTD_METHOD)
        _refuse_v2_model_runner()
        self.spec_method = None
        ptd = split_speculative_dict(spec, defaults=platform_budget_defaults())
        refuse(engine_args_refusals(self, target_model_config, target_parallel_config))
        self.speculative_config = {
            "method": "custom_class",
            "model": PROPOSER_CLASS_PATH,
            # The scheduler allocates KV slots for at most this many draft tokens per request.
            "num_speculative_tokens": max(ptd.max_nodes, 1),
        }
        _select_tree_attention_backend(self)
        config = original(self, target_model_config, target_parallel_config)
        config.ptd = asdict(ptd)
        return config

    return create_speculative_config


def _select_tree_attention_backend(engine_args) -> None:
    """On CUDA, PTD's tree attention lives in the Triton backend: pick it unless the user
    asked for another one, which PTD cannot serve (refused with the reason)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return
    chosen = engine_args.attention_backend or getattr(engine_args.attention_config,
                                                      "backend", None)
    if chosen is None:
        engine_args.attention_backend = "TRITON_ATTN"
    elif getattr(chosen, "name", str(chosen)) != "TRITON_ATTN":
        raise ValueError(f"method 'ptd' needs the TRITON_ATTN attention backend on CUDA "
                         f"(its tree-attention kernel); got {chosen}")


def _refuse_v2_model_runner() -> None:
    """PTD's patches live in vLLM's V1 model runner; `VLLM_USE_V2_MODEL_RUNNER=1` forces the
    V2 runner, which would serve the engine without them."""
    from vllm import envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise ValueError("method 'ptd' runs on vLLM's V1 model runner; unset "
                         "VLLM_USE_V2_MODEL_RUNNER (or set it to 0)")
