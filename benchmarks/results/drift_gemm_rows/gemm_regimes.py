"""Are calls of 33 to ~300 rows consistent with each other? Rows of M-row calls against the
same rows of a 64-row call (first 33 rows compared)."""
import os
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402
torch.manual_seed(0)
for K, N in ((576, 960), (576, 3072), (1536, 576), (576, 49152)):
    layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    X = torch.randn(800, K, dtype=torch.bfloat16)
    ref = layer.cpu_linear(X[:64], layer.weight, None)[:33]
    res = {}
    for M in (32, 33, 40, 48, 65, 96, 128, 200, 256, 300, 350, 400, 512, 800):
        d = (layer.cpu_linear(X[:M], layer.weight, None)[:33] - ref[:min(M, 33)]).abs().amax(dim=1)
        res[M] = int((d > 0).sum())
    print(f"{K}->{N}: of the first 33 rows, differing from a 64-row call:", res, flush=True)
