"""Does a row's output of vLLM's CPU linear layers depend on the call's row count or on the
row's index in the call? Every row of M-row calls against the same rows of an 800-row call."""
import os
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402
torch.manual_seed(0)
for K, N in ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)):
    layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    X = torch.randn(800, K, dtype=torch.bfloat16)
    ref = layer.cpu_linear(X, layer.weight, None)
    res = {}
    for M in (1, 2, 5, 16, 17, 31, 32, 33, 40, 48, 64, 100, 300, 400):
        d = (layer.cpu_linear(X[:M], layer.weight, None) - ref[:M]).abs().amax(dim=1)
        res[M] = f"{int((d > 0).sum())}/{M}"
    # the same row at other offsets: row r of X placed at index i of a 40-row call
    row = X[5:6]
    offs = []
    for i in range(40):
        Y = X[100:140].clone(); Y[i] = row
        offs.append(int((layer.cpu_linear(Y, layer.weight, None)[i] - ref[5]).abs().max().item() > 0))
    print(f"{K}->{N}: rows differing from the 800-row call", res, "| row 5 at offsets 0-39 differs:", "".join(map(str, offs)), flush=True)
