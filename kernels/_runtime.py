"""Which Triton runtime the kernels were built for.

``triton.jit`` picks the CPU interpreter when ``TRITON_INTERPRET=1`` is set at the
time a function is decorated, and Triton's own library functions are decorated when
Triton is first imported. So the variable must be set before anything imports Triton
(vLLM does): tests/conftest.py does it for machines without CUDA.
"""

import importlib

import triton.language.standard as tl_standard
from triton.runtime.interpreter import InterpretedFunction


def interpreter_active() -> bool:
    """True when the kernels *and Triton's own library* run in the CPU interpreter.

    Both matter: if Triton was imported before ``TRITON_INTERPRET=1`` but our modules
    after, our kernels are interpreted while ``tl.sum`` & co. are not, and every
    launch fails.
    """
    # import_module, not "from . import": the package re-exports a function under the
    # submodule's name.
    module = importlib.import_module(".tree_attention", __package__)
    return isinstance(
        module._tree_attention_kernel, InterpretedFunction
    ) and isinstance(tl_standard._sum_combine, InterpretedFunction)
