"""The temporary experiment behind regime_pad_tune_c32/ (not shipped): every vLLM CPU linear
layer of the PTD engine computed in one row-count regime where it could be, to test whether
the regimes (gemm_regimes.py) cause PTD's repeated answers to drift. Calls of 17-32 rows padded
to 33; the LM head split above 350 rows, other layers above 700. Wired in for the run through a
temporary PTD config key ("regime_pad": true) whose proposer `load_model(target_model)` called
`pad_linear_regimes(target_model)`; both removed after the run.

Command: vllm-ptd bench --interleave --multiprocess --repeat --methods plain ptd
  --ptd 'ptd={}' 'pad={"regime_pad":true}' --datasets mt_bench --split tune --prompts 32
  --max-tokens 64 --concurrency 32 --save-outputs
Result: drifted repeated answers 40/64 with and without it; speed within noise."""
import torch


def pad_linear_regimes(model) -> int:
    def wrap(f, lm_head):
        def g(x, w, b):
            m = x.shape[0]
            if x.dim() == 2 and 17 <= m <= 32:
                return f(torch.cat([x, x.new_zeros(33 - m, x.shape[1])]), w, b)[:m]
            limit = 350 if lm_head else 700
            if x.dim() == 2 and m > limit:
                size = -(-m // -(-m // limit))
                return torch.cat([f(x[i:i + size], w, b) for i in range(0, m, size)])
            return f(x, w, b)
        return g
    count = 0
    for module in model.modules():
        f = getattr(module, "cpu_linear", None)
        if f is not None and getattr(module, "weight", None) is not None:
            module.cpu_linear = wrap(f, module.weight.shape[0] >= 40000)
            count += 1
    return count
