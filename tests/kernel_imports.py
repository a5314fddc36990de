"""Import PTD's kernels the same way with and without an install of the project.

``vllm_ptd.kernels`` is ``kernels/`` only through an (editable) install; on the lent GPU
machine the project is not installed, so the checkout's ``kernels/`` is imported as a
top-level package instead (the repository root goes on ``sys.path``). Nothing here
imports vLLM. ``TRITON_INTERPRET=1`` is set first when no CUDA device is visible, as
``tests/conftest.py`` does, so importing this module alone also works in a script.
"""

import importlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    from vllm_ptd import kernels
except ImportError:  # checkout without install: kernels/ is the package source
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import kernels  # type: ignore[no-redef]

interpreter_active = importlib.import_module(kernels.__name__ + "._runtime").interpreter_active

if DEVICE == "cpu" and not interpreter_active():
    raise RuntimeError(
        "Triton was imported before TRITON_INTERPRET=1 was set; without a GPU the "
        "kernels need the interpreter (see tests/conftest.py)"
    )

__all__ = ["DEVICE", "ROOT", "interpreter_active", "kernels"]
