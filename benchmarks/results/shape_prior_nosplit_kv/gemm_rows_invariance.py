"""Does a row's output of vLLM's CPU linear layers depend on how many rows the call has?
The embedded model's projections and its LM head (576 -> 49152, tied embeddings), through
vLLM's own dispatch (`dispatch_cpu_unquantized_gemm`), one thread as vLLM's multiprocess
engine runs on this 2-core machine: row 0's max difference against the 800-row call.
Usage: THREADS=1 python THIS"""
import os

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402

torch.manual_seed(0)
for K, N in ((576, 1536), (1536, 576), (576, 49152)):
    layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    X = torch.randn(800, K, dtype=torch.bfloat16)
    Ms = (1, 16, 32, 33, 64, 100, 128, 160, 256, 300, 400, 500, 512, 800)
    out = {M: layer.cpu_linear(X[:M], layer.weight, None) for M in Ms}
    print(f"{K} -> {N}:", {M: f"{(out[M][0] - out[800][0]).abs().max().item():.0e}" for M in Ms})
