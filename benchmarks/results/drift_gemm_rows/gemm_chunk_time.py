import os, time
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402
torch.manual_seed(0)
def t(f, n=30):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e3
for K, N in ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)):
    layer = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    f = layer.cpu_linear
    out = []
    for M in (32, 64, 128, 300, 512):
        X = torch.randn(M, K, dtype=torch.bfloat16)
        whole = t(lambda: f(X, layer.weight, None))
        chunked = t(lambda: torch.cat([f(X[i:i + 32], layer.weight, None) for i in range(0, M, 32)]))
        out.append(f"M={M}: {whole:.3f} vs {chunked:.3f} ms")
    print(f"{K}->{N}:", "; ".join(out), flush=True)
