"""The kernels and PTD's core import without vLLM (the lent GPU machine has none).

A fresh interpreter with ``import vllm`` blocked (benchmarks/pytest_without_vllm.py's
finder) imports ``vllm_ptd``, its core and config, and the kernels both ways (installed
``vllm_ptd.kernels`` when the package is installed, else the checkout's ``kernels/``);
nothing may load vLLM.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = f"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
from pytest_without_vllm import block_vllm, drop_editable_install
block_vllm()
if sys.argv[1] == "checkout":
    drop_editable_install()
import vllm_ptd, vllm_ptd.config, vllm_ptd.core, vllm_ptd.core.driver
import importlib.metadata
try:
    importlib.metadata.distribution("vllm-ptd")
    installed = sys.argv[1] != "checkout"
except importlib.metadata.PackageNotFoundError:
    installed = False  # a bare checkout (the GPU machine): kernels/ is the top-level package
try:
    from vllm_ptd import kernels
except ImportError:
    assert not installed, "vllm-ptd is installed, yet vllm_ptd.kernels does not import"
    import kernels
kernels.tree_attention, kernels.compact_kv, kernels.pack_tree_masks
loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
assert not loaded, loaded
print("ok", kernels.__name__)
"""


def run(mode: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_imports_without_vllm_from_the_checkout() -> None:
    assert run("checkout").split() == ["ok", "kernels"]


def test_imports_without_vllm_as_installed_or_checkout() -> None:
    assert run("any").startswith("ok")
