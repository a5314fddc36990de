"""Does a row of the real model's o_proj, in vLLM's default multiprocess engine (one thread,
oneDNN), depend on how many rows share its call? Rows saved by first_differing_op.py and random
rows, layers 0, the saved one and 29.
Usage (repository root): VLLM_ALLOW_INSECURE_SERIALIZATION=1 python THIS"""
import os
import sys


def probe(model):
    import os
    import torch
    d = torch.load(os.path.abspath("o_proj_input.pt"))
    xs = d["spec"][0]
    res = {"threads": torch.get_num_threads()}
    torch.manual_seed(0)
    R = torch.randn(32, 576, dtype=torch.bfloat16)
    for li in (0, d["layer"], 29):
        m = model.model.layers[li].self_attn.o_proj
        for label, X in (("real", torch.cat([xs, xs])), ("random", R)):
            outs = {M: m(X[:M].contiguous())[0] for M in range(1, 33)}
            res[(li, label, "vs M=1")] = [M for M in outs if not torch.equal(outs[M][0], outs[1][0])]
            res[(li, label, "vs M=5")] = [M for M in outs if not torch.equal(outs[M][:min(M,5)], outs[5][:min(M,5)])]
            res[(li, label, "rows of M=16 vs alone")] = sum(int(not torch.equal(outs[16][r], m(X[r:r+1].contiguous())[0][0])) for r in range(16))
    return res


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from o_proj_rows_in_engine import probe as shipped_probe  # picklable by module name
    from vllm_ptd.engine_utils import make_llm
    llm = make_llm(None, dtype="bfloat16", max_num_seqs=1)
    for key, value in llm.apply_model(shipped_probe)[0].items():
        print(key, value)
