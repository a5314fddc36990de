"""Per-request PTD state: draft tree T, draft pool P, counters. Engine independent.

The engine calls, each step, `propose(x)` -> layout, runs the target over the layout, verifies
(core.verify), then `observe(layout, argmax, result)`. All per-step work here is O(nodes); no
vocabulary-sized array is ever touched.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from vllm_ptd.config import AUTO, CHAIN, TREE, PTDConfig
from vllm_ptd.core.candidates import merge_with_pool
from vllm_ptd.core.chain import candidate_chains, choose_chain
from vllm_ptd.core.context_index import ContextIndex
from vllm_ptd.core.layout import (
    TreeLayout,
    flatten_draft_tree,
    flatten_trie,
    make_layout,
    split_budget,
)
from vllm_ptd.core.metrics import PTDStats
from vllm_ptd.core.pool import DraftPool
from vllm_ptd.core.shadow import ShadowChain
from vllm_ptd.core.shared_outputs import SharedOutputs, TenantView
from vllm_ptd.core.tree import DraftTree, Node
from vllm_ptd.core.verify import VerifyResult


class ChainPolicy(Protocol):
    """What chain drafting asks of the budget policy (core/budget.py's BudgetPolicy)."""

    def chain_value(self, classes: list[int]) -> float: ...

    def chain_length(self, classes: list[int]) -> int: ...

    def record_shadow(self, classes: list[int], accepted: int) -> None: ...


def prompt_seed(seed: int, prompt_token_ids: Sequence[int]) -> int:
    """A seed that depends only on `seed` and the prompt (stable across processes, unlike
    Python's salted hash), so every worker builds the same drafts."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(8, "little", signed=False))
    h.update(np.asarray(prompt_token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


class PTDRequestState:
    """Drafting state of one request.

    Args:
        config: PTD parameters.
        prompt_token_ids: the prompt; seeds T.
        stop_token_ids: the tokenizer's EOS and the request's stop ids; never drafted in T.
        seed: optional per-request seed mixed in after `config.seed` (e.g. the request's
            sampling seed); None uses `config.seed` alone.
        shared: other requests' finished outputs (chains draft from them too), or None: the
            view of the request's own tenant (`TenantView`: same `cache_salt`) in engines.
    """

    def __init__(
        self,
        config: PTDConfig,
        prompt_token_ids: Sequence[int],
        stop_token_ids: frozenset[int],
        seed: int | None = None,
        shared: SharedOutputs | TenantView | None = None,
    ):
        self.config = config
        self.shared = shared
        self.prompt_len = len(prompt_token_ids)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.tree = DraftTree(config.width, config.depth, config.num_roots, self.stop_token_ids)
        self.pool = DraftPool(config.pool_cap)
        base = prompt_seed(config.seed, prompt_token_ids)
        if seed is not None:
            base = prompt_seed(base % 2**63, [seed])
        self.tree.seed_from_prompt(prompt_token_ids, random.Random(base))
        self.context: ContextIndex | None = None
        if config.context_ngram > 0:
            self.context = ContextIndex(
                config.context_ngram, config.context_min_ngram,
                max_length=config.match_length if config.draft_shape != TREE else 0)
            self.context.extend(prompt_token_ids)
        self.stats = PTDStats()
        # What the last propose() returned, to map rows back to T nodes in observe().
        self._t_nodes: list[Node] = []
        self._proposed_len = 0
        self._proposed_nc = 0
        # Rows of earlier chains that did not run, checked against the tokens committed
        # after them (core/shadow.py): one at a time from the own context, one from the
        # shared outputs (`candidate_chains`'s two), so that an unchosen source learns too.
        self.shadows: list[ShadowChain | None] = [None, None]
        # Evidence classes of the last chain proposed (core/chain.py), before any cut;
        # [] after a tree.
        self.chain_classes: list[int] = []
        # The shape of a proposal without one given: auto without a policy drafts trees.
        self.default_shape = TREE if config.draft_shape == AUTO else config.draft_shape
        self.last_shape = self.default_shape   # TREE or CHAIN: the last proposal's

    def propose(self, x: int, budget: int | None = None,
                committed: Sequence[int] | None = None,
                candidate_cap: int | None = None,
                chain_policy: ChainPolicy | None = None,
                shape: str | None = None) -> TreeLayout:
        """Layout [x; C; T] with C = P[x] (merged with context matches when enabled) and T the
        draft tree, trimmed to `budget` rows besides x (default config.max_nodes) by the policy
        in `layout.split_budget`. Rows of C and T are DFS prefixes of their trees, so the
        result is a valid tree for any budget. With `draft_shape` chain: [x; chain], the
        chain of core/chain.py, at most `budget` rows besides x and no T.

        committed: the tokens committed since the last call, ending with x (default [x]);
        they extend the context index.
        candidate_cap: C's cap for this call (default config.max_candidate_nodes); a smaller
        budget shrinks it in proportion, so that T keeps its share (see core/budget.py).
        chain_policy: chains only; picks between candidate chains (`chain_value`) and how
        many of the chosen chain's leading rows to run (`chain_length`), both from the
        rows' evidence classes. None: the longer match, all of its rows.
        shape: TREE or CHAIN, this step's (draft_shape auto: the policy's choice); default
        the configured shape (trees for auto).
        """
        cfg = self.config
        budget = cfg.max_nodes if budget is None else budget
        committed = [x] if committed is None else committed
        self._check_shadows(committed, chain_policy)
        if self.context is not None:
            self.context.extend(committed)
            if self.context.tokens[-1] != x:
                raise ValueError(f"context history ends with {self.context.tokens[-1]}, not x={x}")
        if (shape or self.default_shape) == CHAIN:
            return self._propose_chain(x, budget, chain_policy)
        self.chain_classes = []
        c_rows = ([], [], [])
        if self.context is not None:
            found = self.context.continuations(cfg.context_depth, cfg.context_matches)
            if found:
                trie = self.pool.tries.get(x)
                merged = merge_with_pool(found, {} if trie is None else trie.root)
                c_rows = flatten_trie(merged, budget)
        num_c = len(c_rows[0]) if c_rows[0] else self.pool.size(x)
        cap = cfg.max_candidate_nodes if candidate_cap is None else candidate_cap
        nc, nt = split_budget(num_c, self.tree.num_nodes(), budget, cap)
        if c_rows[0]:
            c_rows = tuple(rows[:nc] for rows in c_rows)
        else:
            c_rows = self.pool.flatten(x, nc)
        tt, tp, td, nodes = flatten_draft_tree(self.tree.roots, offset=nc + 1, limit=nt)
        return self._proposed(make_layout(x, c_rows, (tt, tp, td)), nodes, TREE)

    def _propose_chain(self, x: int, budget: int, policy: ChainPolicy | None) -> TreeLayout:
        cfg = self.config
        trie = self.pool.tries.get(x)
        own, other, ngrams = candidate_chains(
            self.context, None if trie is None else trie.root, budget,
            cfg.context_depth, cfg.context_matches, self.shared)
        tokens, self.chain_classes = choose_chain(
            own, other, ngrams, None if policy is None else policy.chain_value)
        keep = len(tokens) if policy is None else min(policy.chain_length(self.chain_classes),
                                                      len(tokens))
        # Only with a context index are the committed tokens passed whole (a shadow's input).
        if policy is not None and self.context is not None:
            for slot, candidate in enumerate((own, other)):
                if candidate is None or self.shadows[slot] is not None:
                    continue
                ran = keep if candidate[1] is self.chain_classes else 0
                if ran < len(candidate[0]):
                    self.shadows[slot] = ShadowChain(candidate[0], candidate[1], ran)
        rows = (tokens[:keep], list(range(keep)), list(range(1, keep + 1)))
        return self._proposed(make_layout(x, rows, ([], [], [])), [], CHAIN)

    def _check_shadows(self, committed: Sequence[int], policy: ChainPolicy | None) -> None:
        for slot, shadow in enumerate(self.shadows):
            if shadow is None:
                continue
            settled = shadow.feed(committed)
            if settled is None:
                continue
            self.shadows[slot] = None
            classes, accepted = settled
            if classes and policy is not None:
                policy.record_shadow(classes, accepted)

    def _proposed(self, layout: TreeLayout, t_nodes: list[Node], shape: str) -> TreeLayout:
        """Remember what observe() needs to map the verified rows back."""
        self.last_shape = shape
        self._t_nodes = t_nodes
        self._proposed_len = len(layout)
        self._proposed_nc = layout.num_candidates
        return layout

    def observe(self, layout: TreeLayout, argmax: np.ndarray, result: VerifyResult) -> None:
        """Learn from one pass over `layout` (the last proposal or a prefix of it).

        argmax: int64 [len(layout)], the target argmax at each row. Sets T nodes' draft tokens,
        writes T snapshots (bonus-token nodes first) and C's verification feedback into the
        pool, then grows T. T nodes cut off by a truncated layout get no new prediction.
        After a chain T is left as it is: it neither ran nor learned anything, and being
        keyed by tokens, not by positions, it stays valid for the next tree (draft_shape
        auto).
        """
        n = len(layout)
        if n > self._proposed_len or layout.num_candidates != min(self._proposed_nc, n - 1):
            raise ValueError("observe() needs the layout of the last propose() or a prefix of it")
        am = np.asarray(argmax).tolist()
        if len(am) < n:
            raise ValueError(f"argmax has {len(am)} rows, layout has {n}")
        nc = self._proposed_nc
        for i, node in enumerate(self._t_nodes[: max(0, n - 1 - nc)]):
            d = am[nc + 1 + i]
            if node.draft != d:
                node.draft = d
                node.dirty = True
        bonus = result.bonus
        if self.last_shape == TREE:   # chains never carry T: it needs no upkeep
            self._update_draft_tree(bonus)

        # Verification feedback: x and every C row get the target's argmax as a child; each
        # enriched node is merged under its own token.
        if layout.num_candidates > 0:
            toks = layout.tokens[: layout.num_candidates + 1].tolist()
            pars = layout.parents[: layout.num_candidates + 1].tolist()
            c_nodes = [Node(t, draft=a) for t, a in zip(toks, am)]
            for i in range(1, len(c_nodes)):
                c_nodes[pars[i]].children.append(c_nodes[i])
            for node in c_nodes:
                self.pool.insert(node)
        else:
            self.pool.insert(Node(int(layout.tokens[0]), draft=am[0]))

        self.stats.record(
            layout.num_candidates, layout.num_draft, len(result.accepted), len(result.tokens)
        )
        self._t_nodes = []
        self._proposed_len = 0

    def _update_draft_tree(self, bonus: int) -> None:
        """T snapshots into the pool, then T grows by one level under the bonus token."""
        # T snapshots, only of subtrees whose content changed since the pool last saw them
        # (re-merging an unchanged subtree adds nothing). Reverse DFS order visits children
        # before parents, so one pass marks every node with a changed descendant.
        t_nodes = self.tree.nodes()
        changed = []
        for node in reversed(t_nodes):
            if not node.dirty:
                for c in node.children:
                    if c.dirty:
                        node.dirty = True
                        break
            if node.dirty:
                changed.append(node)
        # Bonus-token nodes first: with an asynchronous pool they make the next step's C
        # fresh; synchronously the order is immaterial (they all go to the same trie).
        for node in changed:
            if node.token == bonus:
                self.pool.insert(node)
        for node in changed:
            if node.token != bonus:
                self.pool.insert(node)
        for node in changed:
            node.dirty = False
        self.tree.grow(bonus)

    def prompt_tail(self, n: int) -> list[int]:
        """The last `n` prompt tokens (known through the context index; [] without it)."""
        if self.context is None or n <= 0:
            return []
        return self.context.tokens[max(0, self.prompt_len - n):self.prompt_len]

    def output_tokens(self) -> list[int]:
        """The tokens generated so far (known through the context index; [] without it)."""
        return [] if self.context is None else self.context.tokens[self.prompt_len:]

    def observe_undrafted(self, x: int, committed: Sequence[int]) -> None:
        """A step that ran x alone (nothing proposed) and committed `committed`: counted as
        a step of one token per token, and x -> its successor goes into the pool as
        verification feedback would (with greedy decoding that is the target's argmax)."""
        if committed:
            self.pool.insert(Node(int(x), draft=int(committed[0])))
        self.stats.record(0, 0, 0, len(committed))
