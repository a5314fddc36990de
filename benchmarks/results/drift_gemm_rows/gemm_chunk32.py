"""Would a GEMM run in 32-row chunks be row-count invariant? Row i of M-row calls (M <= 32)
against row i of a 32-row call, and one row at every offset of a 32-row call."""
import os
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402
torch.manual_seed(0)
for K, N in ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)):
    layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    X = torch.randn(64, K, dtype=torch.bfloat16)
    ref = layer.cpu_linear(X[:32], layer.weight, None)
    res = {}
    for M in (1, 2, 3, 8, 15, 16, 17, 24, 31):
        d = (layer.cpu_linear(X[:M], layer.weight, None) - ref[:M]).abs().amax(dim=1)
        res[M] = int((d > 0).sum())
    offs = []
    for i in range(32):
        Y = X[32:64].clone(); Y[i] = X[0]
        offs.append(int((layer.cpu_linear(Y, layer.weight, None)[i] - ref[0]).abs().max().item() > 0))
    print(f"{K}->{N}: rows of M-row calls differing from a 32-row call", res, "| a row at offsets 0-31 of a 32-row call differs:", "".join(map(str, offs)), flush=True)
