"""Is a row's attention output the same when it is the last row of its query (a decode, or
the x row) and when later rows of the same request follow it in the query (a draft row that
gets accepted)? vLLM's CPU attention, bf16, paged KV, one request at a time and in a batch."""
import os, sys, torch
from vllm import _custom_ops as ops
torch.set_num_threads(int(os.environ.get("THREADS", "1"))); torch.manual_seed(0)
# a bf16 matmul first: oneDNN asks the kernel for AMX tiles, which the attention kernel then uses
(torch.randn(256, 256, dtype=torch.bfloat16) @ torch.randn(256, 256, dtype=torch.bfloat16)).sum()
H, KVH, D, BS = 9, 3, 64, 128
dt = torch.bfloat16; isa = sys.argv[1]; split = sys.argv[2] == "1"
R = 4; L = [300 + 37 * i for i in range(R)]; EXTRA = 32
kv = torch.zeros(64, KVH, BS * 2, D, dtype=dt); key_cache, value_cache = kv.chunk(2, dim=2)
bt = torch.zeros(R, 8, dtype=torch.int32)
for r in range(R):
    bt[r] = torch.arange(8 * r, 8 * r + 8)
    n = L[r] + EXTRA
    k = torch.randn(n, KVH, D, dtype=dt); v = torch.randn(n, KVH, D, dtype=dt)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, (8 * r * BS + torch.arange(n)).long(), isa)
Q = [torch.randn(L[r] + EXTRA, H, D, dtype=dt) for r in range(R)]   # a query vector per position
def run(spans):
    """spans[r] = (start, q): request r's query covers positions start..start+q-1."""
    q = torch.cat([Q[r][s:s + n] for r, (s, n) in enumerate(spans)]).contiguous()
    qlens = [n for _, n in spans]
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    sl = torch.tensor([s + n for s, n in spans], dtype=torch.int32)
    md = ops.cpu_attn_get_scheduler_metadata(R, H, KVH, D, sl, dt, qsl, True, -1, isa, split)
    out = torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, qsl, sl, D ** -0.5, True, None, -1, bt, 0.0, md, None)
    return out, qsl
# position p = L[r] - 1 of each request, as a 1-row decode
out, qsl = run([(L[r] - 1, 1) for r in range(R)])
base = [out[qsl[r]].float() for r in range(R)]
for before, after in [(0, 1), (0, 15), (3, 12), (7, 8), (15, 0), (15, 16), (31, 0), (0, 31)]:
    out, qsl = run([(L[r] - 1 - before, before + 1 + after) for r in range(R)])
    got = [out[qsl[r] + before].float() for r in range(R)]
    print(f"row with {before:2d} rows before it and {after:2d} after it in its query:",
          ["%.1e" % (a - b).abs().max().item() for a, b in zip(got, base)])
