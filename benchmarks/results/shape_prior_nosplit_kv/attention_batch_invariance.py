"""Is vLLM's CPU attention batch-invariant? The last row of each of 8 requests (bf16, paged
KV, the given ISA), computed in a batch of all 1-row queries and in batches where other
requests carry 2-16 rows. Usage: python THIS amx 1   (ISA, split-KV 0/1)"""
import sys, torch
from vllm import _custom_ops as ops
import os; torch.set_num_threads(int(os.environ.get("THREADS", "2"))); torch.manual_seed(0); (torch.randn(256,256,dtype=torch.bfloat16)@torch.randn(256,256,dtype=torch.bfloat16)).sum()
H, KVH, D, BS = 9, 3, 64, 128
dt = torch.bfloat16; isa = sys.argv[1]; split = sys.argv[2] == "1"
R = 8; L = [300 + 37 * i for i in range(R)]
nb = 64
kv = torch.zeros(nb, KVH, BS * 2, D, dtype=dt); key_cache, value_cache = kv.chunk(2, dim=2)
bt = torch.zeros(R, 8, dtype=torch.int32)
for r in range(R):
    bt[r] = torch.arange(8 * r, 8 * r + 8)
    k = torch.randn(L[r], KVH, D, dtype=dt); v = torch.randn(L[r], KVH, D, dtype=dt)
    slots = (8 * r * BS + torch.arange(L[r])).long()
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
qs = [torch.randn(16, H, D, dtype=dt) for r in range(R)]
def run(qlens):
    q = torch.cat([qs[r][16 - ql:] for r, ql in enumerate(qlens)]).contiguous()
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    sl = torch.tensor(L, dtype=torch.int32)
    md = ops.cpu_attn_get_scheduler_metadata(R, H, KVH, D, sl, dt, qsl, True, -1, isa, split)
    out = torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, qsl, sl, D ** -0.5, True, None, -1, bt, 0.0, md, None)
    return [out[qsl[r + 1] - 1].float() for r in range(R)]
base = run([1] * R)
import random; random.seed(0)
worst = 0.0
for t in range(20):
    ql = [random.choice([1, 1, 2, 4, 8, 16]) for _ in range(R)]
    o = run(ql)
    worst = max(worst, max((a - b).abs().max().item() for a, b in zip(o, base)))
print(isa, "split", split, "max diff of last rows vs all-decode batch:", worst)
for ql in ([1] * R, [2] + [1] * (R - 1), [1] * (R - 1) + [16], [2] * R, [4] * R, [16] * R):
    o = run(ql)
    print(ql, ["%.1e" % (a - b).abs().max().item() for a, b in zip(o, base)])
