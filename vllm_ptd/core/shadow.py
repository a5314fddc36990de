"""Shadow verification: a chain's rows that did not run, checked against what the request
commits next.

The chain policy (core/budget.py) learns how often a row of each evidence class is accepted
only from rows that run. Rows it prices out never teach it anything, so an estimate learned
in one regime outlives it: shared-output matches learned on first answers (other prompts'
phrasing, often wrong) kept their low rate when the same prompts came again, and a busy batch
declined chains that would have been accepted whole (32 requests at once, repeated GSM8K
prompts: a third of the request-steps declined a 5-11-token match whose every row the
request then committed).

The tokens a request commits after a chain was offered say what verification would have
said about its rows: a row is accepted exactly when it equals the committed token at its
position (greedy), and under sampling a one-token draft is accepted with the target's
probability of that token, which is the chance the committed token equals it; so the check
has the same expectation as running the row. One shadow per request at a time, so that its
observations do not overlap, as run chains do not.
"""

from __future__ import annotations

from collections.abc import Sequence


class ShadowChain:
    """The rows of one offered chain from index `ran` on (the rows before it ran and were
    learned from by verification), waiting for the tokens committed after the chain's x."""

    __slots__ = ("classes", "ran", "seen", "tokens")

    def __init__(self, tokens: Sequence[int], classes: Sequence[int], ran: int):
        self.tokens = list(tokens)
        self.classes = list(classes)
        self.ran = ran
        self.seen = 0   # committed tokens compared so far, all equal to the chain's

    def feed(self, committed: Sequence[int]) -> tuple[list[int], int] | None:
        """Compare newly committed tokens; when the shadow is settled (a mismatch, or every
        row seen), (classes, accepted) for `RowAcceptanceModel.record` of the rows that did
        not run (classes may be empty: the mismatch was in a row that ran); None while the
        committed tokens agree with the chain so far."""
        tokens, n = self.tokens, len(self.tokens)
        for tok in committed:
            if tokens[self.seen] != tok:
                return self._settled(self.seen)
            self.seen += 1
            if self.seen == n:
                return self._settled(n)
        return None

    def _settled(self, accepted: int) -> tuple[list[int], int]:
        if accepted < self.ran:   # verification already learned the first rejected row
            return [], 0
        return self.classes[self.ran:], accepted - self.ran
