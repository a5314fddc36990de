"""Shared pytest setup.

Kernel tests (tests/test_kernels_*.py) run Triton kernels on CPU tensors through
Triton's interpreter when there is no GPU. ``TRITON_INTERPRET`` is read when Triton
(and each kernel) is first imported, and test modules that import vLLM import Triton,
so it is set here, before any test module is collected. Only without CUDA: on a GPU
machine the kernels must compile for real.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Engine tests read PTD's worker-side counters with `llm.collective_rpc(<function>)`, which
# vLLM only ships to the engine process with pickle when this is set (tests only).
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
