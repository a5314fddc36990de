"""vLLM general-plugin entry point (`vllm.general_plugins` -> `ptd`).

vLLM calls `register()` in every process (front end, engine core, each worker), possibly more
than once: it must stay idempotent and cheap.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_ptd")
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from vllm_ptd.version_check import check_vllm_version

    check_vllm_version()
    from vllm_ptd.vllm_integration.patches import apply_all

    apply_all()
    _registered = True
