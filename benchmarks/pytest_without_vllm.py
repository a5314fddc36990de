"""Run pytest in a Python where ``import vllm`` fails, as on the lent GPU machine.

    python benchmarks/pytest_without_vllm.py [pytest args...]

A meta path finder refuses ``vllm`` and every ``vllm.*`` module before pytest starts,
so a test module that imports vLLM at collection time errors here exactly as it would
where vLLM is not installed, and ``pytest.importorskip("vllm")`` skips. The repository
root goes on ``sys.path`` (the checkout's ``vllm_ptd`` and ``kernels`` import from it
without an install). ``benchmarks/gpu_check.sh`` runs the kernel tests through this.

``PTD_CHECKOUT_ONLY=1`` also drops an editable install's import hook, so
``vllm_ptd.kernels`` is missing as on a machine where the project is not installed
and the tests must import ``kernels/`` from the checkout. ``PTD_ALLOW_VLLM=1`` turns
the vLLM block off.
"""

import importlib.abc
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BlockVLLM(importlib.abc.MetaPathFinder):
    """Makes ``import vllm`` (and submodules) raise ``ModuleNotFoundError``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)


def block_vllm() -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, BlockVLLM())


def drop_editable_install() -> None:
    """Forget an editable install of vllm_ptd: only the checkout on sys.path remains."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")
    ]
    for name in [m for m in sys.modules if m == "vllm_ptd" or m.startswith("vllm_ptd.")]:
        del sys.modules[name]


def main(argv: list[str]) -> int:
    if os.environ.get("PTD_ALLOW_VLLM") != "1":
        block_vllm()
    if os.environ.get("PTD_CHECKOUT_ONLY") == "1":
        drop_editable_install()
    sys.path.insert(0, str(ROOT))
    import pytest

    return int(pytest.main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
