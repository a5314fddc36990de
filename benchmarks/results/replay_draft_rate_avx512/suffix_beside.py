"""vLLM's suffix drafter run beside PTD's replay (shared by compare.py and
suffix_at_ptd_steps.py): a suffix cache, vLLM's `suffix` settings with earlier responses kept,
fed each replayed request's prompt and committed tokens, asked for its draft at PTD's steps."""
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

import replay_drafting as rd
from vllm_ptd.core import request_state


class SuffixBeside:
    def __init__(self):
        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        self.rid, self.count, self.started, self.prompt = None, 0, False, []
        state = request_state.PTDRequestState
        orig_init = state.__init__
        beside = self

        def init(self, cfg, prompt, *a, **k):   # a new replayed request
            orig_init(self, cfg, prompt, *a, **k)
            beside._new_request(prompt)
        state.__init__ = init
        self._restore = lambda: setattr(state, "__init__", orig_init)

    def _new_request(self, prompt):
        if self.rid:
            self.cache.stop_request(self.rid)
        self.count += 1
        self.rid, self.started, self.prompt = f"r{self.count}", False, list(prompt)

    def _start(self, output, pos) -> None:
        if not self.started:
            self.cache.start_request(self.rid, np.array(self.prompt, dtype=np.int32))
            self.cache.add_active_response(self.rid, output[:pos])
            self.started = True

    def draft(self, history, output, pos) -> list[int]:
        """Suffix's draft at this step (the request's tokens so far: `history`)."""
        self._start(output, pos)
        return list(self.cache.speculate(self.rid, np.array(history[-24:], dtype=np.int32),
                                         max_spec_tokens=24, max_spec_factor=1.0,
                                         min_token_prob=0.1).token_ids)

    def committed(self, output, pos, accepted) -> None:
        """The step at `pos` committed `accepted` drafts and one token more."""
        self._start(output, pos)
        self.cache.add_active_response(self.rid, output[pos:pos + accepted + 1])

    def close(self) -> None:
        self._restore()


ACCEPTED = rd._accepted   # the unhooked count of a draft's accepted rows
