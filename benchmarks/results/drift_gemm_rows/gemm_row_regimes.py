"""Does a row's output of vLLM's CPU linear layers depend on the call's row count or on the
row's place in the call? The embedded model's projections and its LM head (576 -> 49152, tied
embeddings), bf16, through vLLM's own dispatch (`dispatch_cpu_unquantized_gemm`).
Usage (repository root): THREADS=1 python THIS   (one thread, as vLLM's multiprocess engine)

1. every row of M-row calls against the same rows of an 800-row call, and one row at each
   offset of a 40-row call;
2. calls of at most 32 rows against a 32-row call, and one row at each offset of it;
3. the first 33 rows of M-row calls against a 64-row call."""
import os

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402

SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152))


def layers():
    torch.manual_seed(0)
    for K, N in SHAPES:
        layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        yield f"{K}->{N}", lambda x, layer=layer: layer.cpu_linear(x, layer.weight, None), K


def differing(a, b) -> int:
    return int(((a - b).abs().amax(dim=1) > 0).sum())


def at_offsets(f, X, row, ref_row, size) -> str:
    flags = []
    for i in range(size):
        Y = X[100:100 + size].clone()
        Y[i] = row
        flags.append(int((f(Y)[i] - ref_row).abs().max().item() > 0))
    return "".join(map(str, flags))


print("1. rows differing from an 800-row call | row 5 at offsets 0-39 of a 40-row call")
for name, f, K in layers():
    X = torch.randn(800, K, dtype=torch.bfloat16)
    ref = f(X)
    res = {M: f"{differing(f(X[:M]), ref[:M])}/{M}"
           for M in (1, 2, 5, 16, 17, 31, 32, 33, 40, 48, 64, 100, 300, 400)}
    print(name, res, "|", at_offsets(f, X, X[5], ref[5], 40), flush=True)

print("2. rows of M-row calls differing from a 32-row call | a row at offsets 0-31 of one")
for name, f, K in layers():
    X = torch.randn(800, K, dtype=torch.bfloat16)
    ref = f(X[:32])
    res = {M: differing(f(X[:M]), ref[:M]) for M in (1, 2, 3, 8, 15, 16, 17, 24, 31)}
    print(name, res, "|", at_offsets(f, X, X[0], ref[0], 32), flush=True)

print("3. of the first 33 rows, differing from a 64-row call")
for name, f, K in layers():
    X = torch.randn(800, K, dtype=torch.bfloat16)
    ref = f(X[:64])[:33]
    res = {M: differing(f(X[:M])[:33], ref[:min(M, 33)])
           for M in (32, 33, 40, 48, 65, 96, 128, 200, 256, 300, 350, 400, 512, 800)}
    print(name, res, flush=True)
