"""Give PTD engines vLLM's full plain-decoding sampler.

With any speculative config, vLLM 0.32 drops the min_p and logit-bias logits processors and
refuses requests that use them ("not yet supported with speculative decoding"), because its
linear rejection sampler cannot honour them. PTD verifies trees with each row's exact
distribution (tree_sampling.py) and vLLM's own Sampler serves every row without a tree, so a
PTD engine keeps the builtin processors and accepts those requests. Engines that do not run
PTD are untouched. Custom logits processors stay refused, as vLLM refuses them with any
speculative method.
"""

from __future__ import annotations

from vllm_ptd.vllm_integration.spec_config import ptd_config_of


def make_build_logitsprocs(original):
    def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model,
                          custom_logitsprocs=()):
        if ptd_config_of(vllm_config.speculative_config) is None or is_pooling_model:
            return original(vllm_config, device, is_pin_memory, is_pooling_model,
                            custom_logitsprocs)
        from vllm.v1.sample.logits_processor import (
            BUILTIN_LOGITS_PROCESSORS,
            STR_SPEC_DEC_REJECTS_LOGITSPROCS,
            LogitsProcessors,
        )

        if custom_logitsprocs:
            raise ValueError(STR_SPEC_DEC_REJECTS_LOGITSPROCS)
        return LogitsProcessors(ctor(vllm_config, device, is_pin_memory)
                                for ctor in BUILTIN_LOGITS_PROCESSORS)

    return build_logitsprocs


def make_validate_spec_decode(original):
    def _validate_spec_decode(self, speculative_config):
        if ptd_config_of(speculative_config) is not None:
            return None  # min_p and logit_bias are served exactly under PTD
        return original(self, speculative_config)

    return _validate_spec_decode
