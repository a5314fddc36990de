"""Which CUDA graphs a PTD engine runs: FULL graphs for plain decode steps, piecewise for
steps that carry trees.

vLLM sizes its "uniform decode" batch, the one its FULL decode graphs are captured for, as
1 + num_speculative_tokens tokens per request. For PTD that number is only the scheduler's
slot bound (max_nodes): a PTD step's query length varies per request and per step, so no
step is ever that uniform batch. Worse, a FULL graph replays the attention it captured, which
has no tree in it, so vLLM must never replay one over a step with trees. PTD's Triton backend
therefore claims FULL graphs only for single-token decode (`UNIFORM_SINGLE_TOKEN_DECODE`),
and with a uniform length above 1 vLLM 0.32 then drops FULL graphs for the whole engine
(`CompilationConfig.resolve_cudagraph_mode_and_sizes`: FULL_AND_PIECEWISE becomes PIECEWISE),
plain steps included.

A PTD engine's uniform decode batch is one token per request: a step in which no request
drafted. Such a step has no tree (every tree has a row beside x, so a step with one is never
uniform), and one-token attention is the same causal or tree. With the length set to 1 on the
runner and on its graph dispatcher before vLLM resolves the graph mode, vLLM's default
FULL_AND_PIECEWISE stands: steps without drafts replay FULL graphs (attention captured
inside), steps with trees or prompt tokens run piecewise graphs, where attention runs eagerly
and PTD's backend sees the step's tree. FULL_DECODE_ONLY runs the tree steps eagerly;
PIECEWISE and NONE are unchanged; a mixed-batch FULL mode is downgraded by vLLM as for any
backend without full support for mixed batches.
"""

from __future__ import annotations

# A PTD step is "uniform decode" only when every request runs its one committed token.
PTD_UNIFORM_DECODE_QUERY_LEN = 1


def make_check_and_update_cudagraph_mode(original):
    def _check_and_update_cudagraph_mode(self, *args, **kwargs):
        from vllm_ptd.vllm_integration.proposer import PTDProposer

        if isinstance(getattr(self, "drafter", None), PTDProposer):
            self.uniform_decode_query_len = PTD_UNIFORM_DECODE_QUERY_LEN
            self.cudagraph_dispatcher.uniform_decode_query_len = PTD_UNIFORM_DECODE_QUERY_LEN
        return original(self, *args, **kwargs)

    return _check_and_update_cudagraph_mode
