"""Which Triton runtime the kernels were built for.

``triton.jit`` picks the CPU interpreter when ``TRITON_INTERPRET=1`` is set at the
time a function is decorated, and Triton's own library functions are decorated when
Triton is first imported. So the variable must be set before anything imports Triton
(vLLM does): tests/conftest.py does it for machines without CUDA.
"""

import importlib

from triton.runtime.interpreter import InterpretedFunction


def interpreter_active() -> bool:
    """True when the kernels were decorated for Triton's CPU interpreter."""
    # import_module, not "from . import": the package re-exports a function under the
    # submodule's name.
    module = importlib.import_module(".tree_attention", __package__)
    return isinstance(module._tree_attention_kernel, InterpretedFunction)
