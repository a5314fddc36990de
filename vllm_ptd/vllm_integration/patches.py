"""Every place vllm-ptd touches vLLM internals, in one list.

Each entry names the vLLM attribute, why it is patched, and the factory that wraps it. The
whole list is applied once per process by `vllm_ptd.plugin.register()`, after the exact
version check (vllm_ptd.version_check).
"""

from __future__ import annotations

from vllm_ptd.patching import Patch
from vllm_ptd.vllm_integration import spec_config

ALL_PATCHES: list[Patch] = [
    Patch(
        module="vllm.engine.arg_utils",
        owner="EngineArgs",
        attr="create_speculative_config",
        make=spec_config.make_create_speculative_config,
        why="accept method 'ptd' with PTD's own keys; map it onto vLLM's custom_class path",
    ),
]


def apply_all() -> None:
    for patch in ALL_PATCHES:
        patch.apply()
