"""What PTD cannot serve exactly, refused before the engine serves a request.

Each reason names the feature. Three moments, each with what it can see:
- `engine_args_refusals`: in the front end, when the speculative config is built (model and
  parallel config, the user's engine arguments): the earliest and clearest place;
- `engine_config_refusals`: in the worker, when the proposer is built from the complete
  VllmConfig (compilation passes resolved from the optimisation level);
- `attention_layer_refusals`: in the worker, once the model is loaded (per attention layer:
  windows, sinks, ALiBi, soft-capping, shared KV, KV dtype), before the KV cache is
  allocated.
"""

from __future__ import annotations

from typing import Any

WHY = "speculative method 'ptd' cannot serve this engine exactly"


class PTDUnsupportedEngine(ValueError):
    pass


def refuse(reasons: list[str]) -> None:
    if reasons:
        raise PTDUnsupportedEngine(f"{WHY}: " + "; ".join(dict.fromkeys(reasons)))


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _fp8(dtype: Any) -> bool:
    return dtype is not None and str(dtype).startswith("fp8")


MROPE = ("M-RoPE (multimodal rotary positions, e.g. Qwen2-VL): PTD writes tree depths into "
         "`positions`, and these models read `mrope_positions`")
PIPELINE = ("pipeline parallelism: only the last stage runs PTD's drafter, so earlier stages "
            "would attend to tree rows without their positions and masks")
CONTEXT_PARALLEL = ("context parallelism (decode or prefill): PTD reads its tree rows' KV slots "
                    "from the block table of one rank")
MICRO_BATCHING = ("dual batch overlap (micro-batching): tree rows index the whole batch, each "
                  "micro-batch sees a slice of it")
SLIDING_WINDOW = "sliding-window attention: PTD's tree attention attends to the whole context"
SINKS = "attention sinks: PTD's tree attention has no sink term"
FP8_KV = "an fp8 KV cache: PTD's tree attention and KV compaction read and move raw KV rows"
FUSED_QUANT = ("fused attention output quantisation (compilation pass fuse_attn_quant): the "
               "tree attention writes unquantised outputs")
ALIBI = "ALiBi position biases: PTD's tree attention does not add them"
SOFT_CAP = "attention logit soft-capping: PTD's tree attention does not cap logits"
SHARED_KV = ("layers that share another layer's KV cache (kv_sharing_target_layer_name): "
             "accepted rows would be compacted twice")


def engine_args_refusals(engine_args: Any, model_config: Any, parallel_config: Any
                         ) -> list[str]:
    reasons = []
    if _get(model_config, "uses_mrope", False):
        reasons.append(MROPE)
    if (_get(parallel_config, "pipeline_parallel_size", 1) or 1) > 1:
        reasons.append(PIPELINE)
    if max(_get(parallel_config, "decode_context_parallel_size", 1) or 1,
           _get(parallel_config, "prefill_context_parallel_size", 1) or 1) > 1:
        reasons.append(CONTEXT_PARALLEL)
    if _get(parallel_config, "enable_dbo", False):
        reasons.append(MICRO_BATCHING)
    window = getattr(model_config, "get_sliding_window", None)
    if callable(window) and window() is not None:
        reasons.append(SLIDING_WINDOW)
    if _fp8(_get(engine_args, "kv_cache_dtype")):
        reasons.append(FP8_KV)
    pass_config = _get(_get(engine_args, "compilation_config"), "pass_config")
    if _get(pass_config, "fuse_attn_quant", False):
        reasons.append(FUSED_QUANT)
    return reasons


def engine_config_refusals(vllm_config: Any) -> list[str]:
    """The same checks on the complete config the worker gets."""
    as_args = {"kv_cache_dtype": _get(vllm_config.cache_config, "cache_dtype"),
               "compilation_config": vllm_config.compilation_config}
    return engine_args_refusals(as_args, vllm_config.model_config,
                                vllm_config.parallel_config)


def attention_layer_refusals(layers: dict[str, Any]) -> list[str]:
    """`layers`: the model's attention layers by name (vLLM's `Attention` modules)."""
    reasons = []
    for layer in layers.values():
        if getattr(layer, "sliding_window", None) is not None:
            reasons.append(SLIDING_WINDOW)
        if getattr(layer, "has_sink", False):
            reasons.append(SINKS)
        if getattr(layer, "kv_sharing_target_layer_name", None):
            reasons.append(SHARED_KV)
        if _fp8(getattr(layer, "kv_cache_dtype", None)):
            reasons.append(FP8_KV)
        impl = getattr(layer, "impl", None)
        if getattr(impl, "alibi_slopes", None) is not None:
            reasons.append(ALIBI)
        if getattr(impl, "logits_soft_cap", None):
            reasons.append(SOFT_CAP)
    return list(dict.fromkeys(reasons))


def model_attention_layers(vllm_config: Any) -> dict[str, Any]:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    return get_layers_from_vllm_config(vllm_config, Attention)


# Warnings, not refusals: what PTD serves exactly but slowly.

SLOW_GEMM = ("PTD: {n} linear layers compute through PyTorch's fallback GEMM (vLLM could not "
             "create its oneDNN kernel for {dtype} on this CPU; seen with bf16 on CPUs without "
             "AVX-512). There every draft row costs about as much as a step's own token, so "
             "drafts rarely pay for themselves; serve with --dtype float32")


def fallback_gemm_layers(model: Any) -> int:
    """How many of the model's linear layers vLLM's CPU backend left on PyTorch's fallback
    GEMM: its `cpu_linear` then calls `torch.nn.functional.linear` (vLLM 0.32's
    `dispatch_cpu_unquantized_gemm`), where oneDNN's and the packed small-GEMM kernel call
    `ops`. Rows of a step cost nearly what whole steps do there (~30% of a step each on an
    AVX2 CPU in bf16, against 1-7% with oneDNN)."""
    count = 0
    for module in getattr(model, "modules", lambda: ())():
        call = getattr(module, "cpu_linear", None)
        names = getattr(getattr(call, "__code__", None), "co_names", ())
        if "functional" in names and "linear" in names:
            count += 1
    return count


def slow_gemm_warning(model: Any, dtype: Any) -> str | None:
    """The start-up warning for a model on the fallback GEMM in a half-precision dtype, or
    None. In float32 the fallback is PyTorch's own fast path: nothing to say."""
    if "float32" in str(dtype):
        return None
    n = fallback_gemm_layers(model)
    return SLOW_GEMM.format(n=n, dtype=str(dtype).replace("torch.", "")) if n else None
