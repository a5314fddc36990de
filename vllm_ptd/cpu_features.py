"""What this CPU can do, read from /proc/cpuinfo (Linux; elsewhere nothing is known)."""

from __future__ import annotations

from functools import lru_cache


def _first_cpu_field(name: str) -> str:
    """The value of `name` for the first CPU in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(name)), "").partition(":")[2]
    except OSError:
        return ""


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU listed (empty where /proc/cpuinfo has none)."""
    return frozenset(_first_cpu_field("flags").split())


def cpu_model_name() -> str:
    """The CPU's model name ("" where /proc/cpuinfo has none)."""
    return _first_cpu_field("model name").strip()


def cpu_has_any_flag(*flags: str) -> bool:
    """Whether the CPU reports any of these feature flags (False where none are known)."""
    return not cpu_flags().isdisjoint(flags)


def bf16_gemm_falls_back() -> bool:
    """An x86 CPU without AVX-512, where vLLM 0.32's CPU backend cannot create its oneDNN
    kernel for bf16 and computes bf16 linear layers through PyTorch's slow fallback (see
    vllm_integration/startup_checks.SLOW_GEMM); float32 is the fast dtype there."""
    flags = cpu_flags()
    return "avx2" in flags and "avx512f" not in flags
