"""vLLM general-plugin entry point (`vllm.general_plugins` -> `ptd`).

vLLM calls `register()` in every process (front end, engine core, each worker), possibly more
than once, and does not catch what it raises: an exception here would break every vLLM engine
on the machine, PTD or not. So `register()` never raises. When the installed vLLM is not one
the plugin can patch (`version_check`), or a patch fails, it logs one warning, leaves vLLM as
it is, and only refuses engines that ask for `"method": "ptd"`, naming the problem.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_ptd")
_registered = False
_refusal: str | None = None   # why PTD is off in this process, once register() decided


def register() -> None:
    global _registered, _refusal
    if _registered or _refusal is not None:
        return
    problem = _version_problem()
    if problem is None:
        try:
            from vllm_ptd.vllm_integration.patches import apply_all

            apply_all()
        except Exception as exc:  # noqa: BLE001 (an exception here breaks plain vLLM)
            problem = f"vllm-ptd could not patch this vLLM: {exc!r}"
    if problem is None:
        _registered = True
        _trace_stages_if_asked()
        return
    _refusal = problem
    logger.warning("vllm-ptd is disabled: %s. vLLM runs unchanged; engines with "
                   "speculative method 'ptd' are refused.", problem)
    _refuse_ptd_engines(problem)


def _trace_stages_if_asked() -> None:
    """The development tracer (`VLLM_PTD_STAGE_TRACE`; vllm_integration/stage_trace.py): off
    unless asked for, and never a reason to refuse PTD or break vLLM."""
    try:
        from vllm_ptd.vllm_integration.stage_trace import install_from_env

        install_from_env()
    except Exception:  # a development aid must not break vLLM
        logger.exception("vllm-ptd: the stage trace could not be installed")


def refusal() -> str | None:
    """Why PTD engines are refused in this process (None: PTD is available or not loaded)."""
    return _refusal


def _version_problem() -> str | None:
    from vllm_ptd.version_check import SKIP_ENV, compatibility_problem

    try:
        problem = compatibility_problem()
    except Exception as exc:  # noqa: BLE001
        problem = f"vllm-ptd could not check the installed vLLM: {exc!r}"
    if problem is not None and os.environ.get(SKIP_ENV) == "1":
        logger.warning("%s; %s=1 is set: patching it anyway (unsupported)", problem, SKIP_ENV)
        return None
    return problem


def _refuse_ptd_engines(problem: str) -> None:
    """The only change to vLLM when PTD is off: `"method": "ptd"` fails with the reason
    instead of vLLM's generic list of methods. Other methods go straight to vLLM."""
    from vllm_ptd.patching import Patch
    from vllm_ptd.vllm_integration.spec_config import requests_ptd  # imports no vLLM

    def make(original):
        def create_speculative_config(self, *args, **kwargs):
            if requests_ptd(self):
                raise ValueError(f"speculative method 'ptd' is unavailable: {problem}")
            return original(self, *args, **kwargs)

        return create_speculative_config

    try:
        Patch("vllm.engine.arg_utils", "EngineArgs", "create_speculative_config", make,
              why="refuse method 'ptd' with the reason PTD is off").apply()
    except Exception:
        logger.warning("vllm-ptd could not install its refusal of method 'ptd'", exc_info=True)
