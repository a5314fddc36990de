"""Time of the embedded model's projections (30 layers' worth) and LM head by call rows M, one
thread, vLLM's CPU dispatch: is there a step in cost at small M (where the kernel changes)?"""
import time, torch
torch.set_num_threads(1)
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
layers = {}
for name, (K, N) in SHAPES.items():
    ls = []
    for i in range(30):
        l = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
        dispatch_cpu_unquantized_gemm(l, remove_weight=False)
        ls.append(l)
    layers[name] = (K, ls)
lm = torch.nn.Linear(576, 49152, bias=False).to(torch.bfloat16)
dispatch_cpu_unquantized_gemm(lm, remove_weight=False)
def t_model(M, reps=5):
    best = 1e9
    xs = {K: torch.randn(M, K, dtype=torch.bfloat16) for K in (576, 1536)}
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(30):
            for name in ("qkv", "o", "gate_up", "down"):
                K, ls = layers[name]
                ls[i].cpu_linear(xs[K], ls[i].weight, None)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3
def t_lm(M, reps=5):
    x = torch.randn(M, 576, dtype=torch.bfloat16)
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); lm.cpu_linear(x, lm.weight, None); best = min(best, time.perf_counter() - t0)
    return best * 1e3
for M in [1, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17, 20, 24, 32, 33]:
    print(M, f"projections {t_model(M):.2f} ms  lm_head {t_lm(M):.2f} ms", flush=True)
