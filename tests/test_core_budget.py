"""The load-adaptive budget's parts (core/budget.py), without an engine."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_ptd.core.budget import (
    BudgetPolicy,
    GainModel,
    RowAcceptanceModel,
    StepCostModel,
    budget_sizes,
)
from vllm_ptd.core.chain import CONTEXT, NUM_CLASSES, SHARED, match_source, row_class


def test_cost_model_recovers_a_line_from_noisy_steps() -> None:
    rng = np.random.default_rng(0)
    model = StepCostModel(decay=0.999)
    for _ in range(2000):
        n = int(rng.integers(1, 64))
        model.observe(n, 0.040 + 0.0008 * n + rng.normal(0, 0.002))
    a, b, c = model.coefficients()
    assert a + c == pytest.approx(0.040, abs=0.001)
    assert b == pytest.approx(0.0008, abs=0.00005)
    assert model.predict(10) == pytest.approx(0.048, abs=0.001)


def test_cost_model_separates_the_price_of_each_tree_from_the_price_per_row() -> None:
    rng = np.random.default_rng(1)
    model = StepCostModel(decay=0.999)
    for step in range(3000):
        requests = int(rng.integers(1, 5))
        trees = 0 if step % 8 == 0 else int(rng.integers(1, requests + 1))
        n = requests + trees * int(rng.integers(6, 13))
        model.observe(n, 0.040 + 0.006 * trees + 0.0008 * n + rng.normal(0, 0.002), trees)
    a, b, c = model.coefficients()
    assert a == pytest.approx(0.040, abs=0.001)
    assert c == pytest.approx(0.006, abs=0.001)
    assert b == pytest.approx(0.0008, abs=0.00005)
    assert model.predict(4, drafting=0) == pytest.approx(0.0432, abs=0.001)
    assert model.predict(52, drafting=4) == pytest.approx(0.040 + 0.024 + 0.0416, abs=0.002)


def test_cost_model_without_spread_keeps_the_prior_slope() -> None:
    model = StepCostModel(slope_prior=0.01)
    for _ in range(200):
        model.observe(25, 0.060)          # every step the same size: slope unidentifiable
    a, b, c = model.coefficients()
    assert b == pytest.approx(0.01 * 0.060, rel=1e-6)
    assert a + c + 25 * b == pytest.approx(0.060, rel=1e-6)


def test_cost_model_flags_idle_gaps() -> None:
    early = StepCostModel()
    early.observe(25, 0.06)
    assert early.is_outlier(25, 1.5)       # even before the model can predict
    model = StepCostModel()
    for n in range(1, 20):
        model.observe(n, 0.05)
    assert model.is_outlier(5, 2.0)
    assert not model.is_outlier(5, 0.06)


def test_cost_model_keeps_long_steps_where_every_row_is_dear() -> None:
    """bf16 on a CPU without bf16 GEMMs (measured, AVX2 EPYC): a one-token step 100 ms, each
    further row ~30 ms. A 16-row chain's step is 5.5x the fastest step and still a sample;
    a one-token step of 1.3 s is not."""
    model = StepCostModel()
    model.observe(1, 0.100)
    assert not model.is_outlier(9, 0.336)
    assert not model.is_outlier(16, 0.550)
    assert model.is_outlier(1, 1.3)
    for tokens in (1, 5, 9, 1, 7, 16, 1, 3):
        model.observe(tokens, 0.070 + 0.030 * tokens)
    assert not model.is_outlier(16, 0.550)
    assert model.is_outlier(16, 5.0)


def test_gain_model_learns_the_full_budget_gain_from_grid_sized_trees_only() -> None:
    model = GainModel(max_nodes=24)
    assert model.shape(0) == 0.0 and model.shape(24) == pytest.approx(1.0)
    shapes = model.shape(np.arange(25))
    assert np.all(np.diff(shapes) > 0) and np.all(np.diff(shapes, 2) < 0)  # concave
    for _ in range(1000):
        model.record(24, 1)
    assert model.full_gain == pytest.approx(1.0, abs=1e-3)
    low = GainModel(max_nodes=24)
    for _ in range(1000):
        low.record(24, 0)
    assert low.measured_gain < 1e-3 and low.full_gain == low.floor
    for _ in range(1000):
        model.record(12, 1)            # half budget: 1 token there means more at full
    assert model.full_gain == pytest.approx(1 / float(model.shape(12)), rel=1e-3)
    before = model.full_gain
    for _ in range(1000):
        model.record(3, 0)             # starved trees: not learned from
        model.record(24, 0, request_steps=5)   # nor a young request's steps
    assert model.full_gain == before
    model.record(24, 0, request_steps=16)
    assert model.full_gain < before


def _policy(slope: float, gain: float) -> BudgetPolicy:
    policy = BudgetPolicy(max_nodes=24, explore_every=0)
    for n in range(1, 60):
        policy.cost.observe(n, 0.05 + slope * n)
    for _ in range(500):
        policy.gain.record(24, round(gain))
    return policy


def test_policy_uses_the_whole_tree_when_rows_are_free() -> None:
    assert _policy(slope=0.0, gain=1).choose(1, 1) == 24


def test_budget_sizes_are_a_coarse_grid_up_to_max_nodes() -> None:
    assert budget_sizes(15) == [0, 4, 8, 11, 15]
    assert budget_sizes(24) == [0, 6, 12, 18, 24]
    assert budget_sizes(2) == [0, 1, 2]
    assert budget_sizes(0) == [0]


def test_policy_picks_a_partial_tree_when_each_row_costs_a_few_percent() -> None:
    # A CPU without matrix units: ~4% of a plain step per row, 15% per tree.
    policy = BudgetPolicy(max_nodes=24, explore_every=0)
    for n in range(1, 60):
        policy.cost.observe(n, 0.014 + 0.002 + 0.00056 * n)
    for _ in range(500):
        policy.gain.record(24, 1)
    chosen = policy.choose(1, 1)
    assert 0 < chosen < 24
    n = np.array(budget_sizes(24))
    rate = (1 + policy.gain.full_gain * policy.gain.shape(n)) / np.array(
        [policy.cost.predict(1 + k, int(k > 0)) for k in n])
    assert chosen == n[int(np.argmax(rate))]


def test_policy_budget_shrinks_with_load_down_to_no_drafts() -> None:
    policy = _policy(slope=0.0005, gain=1)
    budgets = [policy.choose(r, r) for r in (1, 4, 16, 32, 64)]
    assert budgets == sorted(budgets, reverse=True)
    assert 0 < budgets[0] and budgets[-1] == 0
    costly = _policy(slope=0.003, gain=0)      # nothing accepted, rows expensive
    assert costly.choose(1, 1) == 0


def test_policy_explores_half_the_budget_every_kth_step() -> None:
    policy = _policy(slope=0.0, gain=1)
    policy.explore_every = 4
    policy.clear_margin = float("inf")
    assert [policy.choose(1, 1) for _ in range(16)] == [24, 24, 24, 12] * 3 + [24, 24, 24, 0]


def test_policy_explores_less_often_when_the_choice_is_clear() -> None:
    clear = _policy(slope=0.0, gain=1)     # a full tree doubles the tokens per second
    clear.explore_every, clear.clear_explore_factor = 4, 2
    assert [clear.choose(1, 1) for _ in range(32)] == [24] * 7 + [12] + [24] * 7 + [12] + \
        [24] * 7 + [12] + [24] * 7 + [0]
    close = _policy(slope=0.0, gain=0)     # the gain floor (0.6 tokens) is all it has
    close.explore_every, close.clear_margin = 4, 1.7
    assert [close.choose(1, 1) for _ in range(8)] == [24, 24, 24, 12] * 2


def test_policy_uses_the_full_budget_until_the_cost_model_has_samples() -> None:
    policy = BudgetPolicy(max_nodes=16)
    assert policy.choose(8, 8) == 16
    assert policy.choose(8, 0) == 0


def test_row_acceptance_model_learns_each_class_from_the_rows_a_chain_reached() -> None:
    model = RowAcceptanceModel(num_classes=3, decay=1.0, prior_weight=1e-9)
    for i in range(96):
        # class 0 always accepted, class 1 accepted one time in four, class 2 behind it
        model.record([0, 1, 2], 1 + int(i % 4 == 0) + int(i % 8 == 0))
    p = model.rates([0, 1, 2])
    assert p[0] == pytest.approx(1.0) and p[1] == pytest.approx(0.25)
    assert p[2] == pytest.approx(0.5)   # reached 24 times (after an accepted row 1), 12 hits
    # P_k = 1.0, 0.25, 0.125: every row beats a price of 0.1, the first only beats 0.3
    keep, surplus = model.leading_surplus([0, 1, 2], 0.1)
    assert keep == 3 and surplus == pytest.approx(0.9 + 0.15 + 0.025)
    assert model.leading_surplus([0, 1, 2], 0.3) == (1, pytest.approx(0.7))
    # a row after the first rejected one says nothing about its class
    before = model.rates([2])[0]
    model.record([1, 2], 0)
    assert model.rates([2])[0] == before


def _chain_policy(row_ms: float, chain_ms: float) -> BudgetPolicy:
    """A chain policy whose cost model saw 10 ms a step, `row_ms` a token and `chain_ms` a
    drafting request, at batch 1 with chains of 0-8 rows."""
    policy = BudgetPolicy(max_nodes=8, chain=True)
    for n in range(300):
        rows = n % 9
        policy.cost.observe(1 + rows, 0.010 + 1e-3 * (row_ms * (1 + rows) + chain_ms * (rows > 0)),
                            drafting=int(rows > 0))
    return policy


def test_chain_policy_keeps_sure_rows_and_drops_chains_that_do_not_pay() -> None:
    """Each row is kept while its predicted acceptance beats its price (b * rate); the whole
    chain only when its surplus also beats the price of drafting at all (c * rate)."""
    policy = _chain_policy(row_ms=0.5, chain_ms=2.0)
    sure, unsure = 0, 1
    for _ in range(200):
        policy.rows_model.record([sure] * 8, 8)       # always accepted
        policy.rows_model.record([unsure] * 8, 0)     # never accepted
    policy.rows_model.record([unsure] * 8, 1)
    assert policy.choose(1, 1) == 8
    a, b, c = policy.cost.coefficients()
    assert (a, b, c) == pytest.approx((0.010, 0.0005, 0.002), rel=0.2)   # ridge priors pull
    rate = (1 + policy.usage.accepted) / (a + c * policy.usage.drafted
                                          + b * (1 + policy.usage.rows))
    assert policy.row_price == pytest.approx(1.15 * b * rate)
    assert policy.chain_price == pytest.approx(1.15 * c * rate)
    assert policy.chain_length([sure] * 8) == 8
    assert policy.chain_length([unsure] * 8) == 0
    # sure rows, then unsure ones: the chain stops where the evidence does
    assert policy.chain_length([sure, sure, sure, unsure, sure]) == 3
    # one sure row pays for itself and for the chain; a coin flip pays a row, not a chain
    for i in range(200):
        policy.rows_model.record([2], int(i % 5 == 0))   # accepted one time in five
    assert policy.rows_model.rates([2])[0] == pytest.approx(0.2, abs=0.01)
    assert policy.chain_length([2]) == 0 and policy.chain_length([sure]) == 1
    assert policy.chain_length([]) == 0


def test_a_barely_observed_class_after_the_cut_is_probed_until_it_is_learned() -> None:
    """Under a busy batch's row price a class priced out by its prior or one early rejection
    would never run again; the row after the cut runs while its class is barely observed."""
    policy = _chain_policy(row_ms=1.5, chain_ms=0.5)
    sure, deep, bad = 0, 1, 2
    for _ in range(200):
        policy.rows_model.record([sure] * 8, 8)
        policy.rows_model.record([sure, bad], 1)      # well observed: always rejected
    for _ in range(2):
        policy.rows_model.record([sure, deep], 1)     # two early rejections
    policy.choose(16, 16)
    p_deep = policy.rows_model.rates([deep])[0]
    assert 0 < p_deep < policy.row_price < 1
    chain = [sure, sure, deep, deep, deep]
    assert policy.chain_length(chain) == 3            # two sure rows, one probe
    assert policy.chain_value(chain) == policy.chain_value([sure, sure])   # probe not valued
    assert policy.chain_length([sure, sure, bad, bad]) == 2   # observed enough: no probe
    for _ in range(30):                               # deep rows are in fact always accepted
        rows = policy.chain_length(chain)
        policy.rows_model.record(chain[:rows], rows)
    assert not policy.rows_model.needs_probe(deep)
    assert policy.chain_length(chain) == 5            # now on their merit


def test_chain_prices_grow_with_the_batch_until_no_chain_pays() -> None:
    policy = _chain_policy(row_ms=0.5, chain_ms=2.0)
    for _ in range(200):
        policy.rows_model.record([0] * 4, 2)          # p ~ 2/3 per row
    lengths = []
    for requests in (1, 8, 64):
        policy.choose(requests, requests)
        lengths.append(policy.chain_length([0] * 4))
    assert lengths[0] >= 2 and lengths[-1] == 0 and lengths == sorted(lengths, reverse=True)


def test_chain_policy_keeps_every_row_until_the_cost_model_has_samples() -> None:
    policy = BudgetPolicy(max_nodes=8, chain=True)
    assert policy.choose(1, 1) == 8 and policy.row_price == policy.chain_price == 0.0
    policy.rows_model.record([0] * 8, 0)
    assert policy.chain_length([0] * 8) == 8
    assert policy.choose(4, 0) == 0


def test_chain_policy_runs_one_chain_whole_after_a_long_spell_without_any() -> None:
    policy = _chain_policy(row_ms=0.5, chain_ms=2.0)
    for _ in range(200):
        policy.rows_model.record([0] * 4, 0)          # rows of this class never accepted
    lengths = []
    for _ in range(2 * policy.chain_explore_after + 2):
        policy.choose(16, 16)
        # two requests of the batch ask for their chains
        lengths.append((policy.chain_length([0] * 4), policy.chain_length([0] * 4)))
    # declined, then one request's chain runs whole in one step, then declined again
    explore = policy.chain_explore_after
    assert lengths[:explore] == [(0, 0)] * explore
    assert lengths[explore] == (4, 0) and lengths.count((4, 0)) == 2
    assert policy.chain_length([]) == 0
    # a chain that ran restarts the count: no exploring while chains run
    policy.record_chain([0] * 4, 2, 1)
    assert all(policy.choose(16, 16) == policy.max_nodes and policy.chain_length([0] * 4) == 0
               for _ in range(explore))


def test_an_exploring_chain_costs_at_most_one_plain_step_where_rows_are_dear() -> None:
    """bf16 through PyTorch's fallback GEMM (an AVX2 CPU): a row costs ~30% of a step, so the
    chain run after a long spell without any is cut to the rows one plain step pays for."""
    policy = _chain_policy(row_ms=3.0, chain_ms=2.0)   # a 1-token step 13 ms, a row 3 ms
    for _ in range(200):
        policy.rows_model.record([0] * 8, 0)
    lengths = []
    for _ in range(policy.chain_explore_after + 1):
        policy.choose(1, 1)
        lengths.append(policy.chain_length([0] * 8))
    a, b, _ = policy.cost.coefficients()
    assert lengths[:-1] == [0] * policy.chain_explore_after
    assert 1 <= lengths[-1] < 8 and lengths[-1] * b <= a + b < (lengths[-1] + 1) * b


# -- draft_shape "auto": one policy chooses chains or trees ---------------------------------

def _cpu_step(drafting: int, tokens: int, trees: int, tree_rows: int) -> float:
    """The AMX CPU's costs: a tree step's forward ~1.8x a chain step's (masked attention in
    every layer, per tree; rows ~0.1 ms)."""
    return 0.019 + 0.001 * drafting + 0.0001 * tokens + 0.015 * trees + 0.0001 * tree_rows


def _gpu_step(drafting: int, tokens: int, trees: int, tree_rows: int) -> float:
    """A GPU at small batch: rows and tree attention nearly free."""
    return 0.010 + 0.0002 * drafting + 0.00001 * tokens + 0.0002 * trees


def _run_auto(step_seconds, steps: int, tree_gain: float = 2.0, row_p: float = 0.6,
              policy: BudgetPolicy | None = None, seed: int = 0) -> tuple[BudgetPolicy, list]:
    """Batch 1 under `step_seconds`: a full tree accepts `tree_gain` tokens (G * s(rows)), a
    chain's rows are accepted one after another with `row_p` each. Returns the policy and
    each step's (shape, rows)."""
    rng = np.random.default_rng(seed)
    policy = policy or BudgetPolicy(max_nodes=15, auto=True)
    ran = []
    for _ in range(steps):
        budget = policy.choose(1, 1)
        shape = policy.step_shape
        if policy.explore is not None:   # the one request explores, as in the proposer
            shape, budget = policy.explore
        if shape == "tree":
            rows = budget
            policy.record_tree(rows, tree_gain * float(policy.gain.shape(rows)), 100)
        else:
            rows = min(budget, policy.chain_length([0] * 8))
            accepted = int(np.argmin(np.append(rng.random(rows) < row_p, False)))
            policy.record_chain([0] * 8, rows, accepted)
        tree = int(shape == "tree" and rows > 0)
        seconds = step_seconds(int(rows > 0), 1 + rows, tree, rows * tree)
        policy.time_step(1 + rows, seconds * (1 + rng.normal(0, 0.02)), int(rows > 0), tree,
                         rows * tree)
        ran.append((shape, rows))
    return policy, ran


def test_shape_cost_model_tells_a_tree_request_from_a_chain_request() -> None:
    rng = np.random.default_rng(2)
    model = StepCostModel(decay=0.999)
    for step in range(3000):
        tree = step % 3 == 0
        rows = int(rng.integers(0, 16))
        trees = int(tree and rows > 0)
        seconds = _cpu_step(int(rows > 0), 1 + rows, trees, rows * trees)
        model.observe(1 + rows, seconds + rng.normal(0, 0.0005), int(rows > 0), trees,
                      rows * trees)
    a, b, c = model.coefficients()
    d, e = model.tree_extras()
    assert (a, b, c) == pytest.approx((0.019, 0.0001, 0.001), abs=2e-4)
    assert (d, e) == pytest.approx((0.015, 0.0001), abs=3e-4)
    assert model.predict(16, 1, 1, 15) / model.predict(9, 1) == pytest.approx(1.8, abs=0.05)


def test_shape_cost_model_prices_a_tree_as_a_chain_until_trees_are_measured() -> None:
    model = StepCostModel()
    for rows in range(100):
        model.observe(1 + rows % 9, _cpu_step(int(rows % 9 > 0), 1 + rows % 9, 0, 0),
                      int(rows % 9 > 0))
    assert model.tree_extras() == (0.0, 0.0)
    assert model.predict(9, 1, 1, 8) == pytest.approx(model.predict(9, 1), rel=1e-9)
    for _ in range(3):      # three measured trees: most of their excess is priced already
        model.observe(16, _cpu_step(1, 16, 1, 15), 1, 1, 15)
    d, e = model.tree_extras()
    assert 0.6 * 0.0165 < d + 15 * e < 0.0165 + 1e-3


def test_auto_drafts_trees_where_tree_rows_are_cheap_and_trees_accept_more() -> None:
    policy, ran = _run_auto(_gpu_step, 600)
    late = ran[200:]
    assert sum(shape == "tree" for shape, _ in late) >= 0.9 * len(late)
    assert policy.gain.full_gain == pytest.approx(2.0, rel=0.05)
    # chains are still tried, boundedly: once in (32 + 1) or (4 * 32 + 1) steps
    chain_steps = sum(shape == "chain" for shape, _ in late)
    assert 1 <= chain_steps <= len(late) // 33 + 1


def test_auto_drafts_chains_where_tree_steps_cost_1_8x_a_chain_step() -> None:
    policy, ran = _run_auto(_cpu_step, 600)
    late = ran[200:]
    tree_steps = sum(shape == "tree" for shape, _ in late)
    assert sum(rows > 0 for shape, rows in late if shape == "chain") >= 0.9 * len(late)
    # trees are still tried, boundedly: chains win clearly here, so once in 4 * 32 + 1 steps
    assert 1 <= tree_steps <= len(late) // 129 + 1
    d, e = policy.cost.tree_extras()
    assert d + 15 * e > 0.5 * 0.0165   # the explored trees priced what tree attention adds


def test_auto_drafts_chains_where_rows_are_cheap_but_chains_accept_more() -> None:
    """Measured acceptance decides as much as cost: a repeated answer's sure chains beat
    trees that accept less, even where tree rows are free."""
    _, ran = _run_auto(_gpu_step, 600, tree_gain=0.8, row_p=0.9)
    late = ran[200:]
    assert sum(shape == "chain" for shape, _ in late) >= 0.9 * len(late)


def test_auto_follows_the_cost_when_it_changes_from_gpu_like_to_cpu_like() -> None:
    """Same acceptance, the hardware's step costs differ: only the measured costs decide."""
    policy, ran = _run_auto(_gpu_step, 300)
    assert ran[-1][0] == "tree"
    policy.cost = StepCostModel()
    _, ran = _run_auto(_cpu_step, 600, policy=policy, seed=1)
    late = ran[300:]
    assert sum(shape == "chain" for shape, _ in late) >= 0.9 * len(late)


def test_auto_tries_the_other_shape_on_one_request_after_a_fixed_number_of_steps() -> None:
    policy, _ = _run_auto(_gpu_step, 200)
    policy.clear_margin = float("inf")     # never clear: the other shape every 33rd step
    steps = [(policy.choose(4, 4), policy.step_shape, policy.explore) for _ in range(200)]
    assert all(shape == "tree" for _, shape, _ in steps)   # the batch keeps its trees
    explored = [i for i, (_, _, explore) in enumerate(steps) if explore is not None]
    assert len(explored) in (6, 7) and np.all(np.diff(explored) == 33)
    # one request's chain, whole, at the chains' current prices
    assert {steps[i][2] for i in explored} == {("chain", 15)}
    policy.shape_explore_after = 0         # 0: never
    assert all((policy.choose(4, 4), policy.explore)[1] is None for _ in range(200))


def test_auto_explores_a_tree_on_one_request_while_chains_win() -> None:
    policy, _ = _run_auto(_cpu_step, 300, tree_gain=0.8, row_p=0.9)
    policy.clear_margin = float("inf")
    steps = [(policy.choose(8, 8), policy.step_shape, policy.explore) for _ in range(100)]
    assert all(shape == "chain" for _, shape, _ in steps)
    explored = [explore for _, _, explore in steps if explore is not None]
    assert len(explored) in (3, 4)   # every 33rd step
    assert all(shape == "tree" and rows > 0 for shape, rows in explored)


def test_auto_warms_up_both_shapes_in_turn() -> None:
    policy = BudgetPolicy(max_nodes=15, auto=True)
    shapes = []
    for _ in range(4):
        assert policy.choose(1, 1) == 15
        shapes.append(policy.step_shape)
    assert shapes == ["tree", "chain"] * 2
    assert policy.row_price == policy.chain_price == 0.0   # warming chains keep every row


def test_fixed_shapes_never_change_shape_and_keep_their_cost_model() -> None:
    tree, chain = BudgetPolicy(max_nodes=15), BudgetPolicy(max_nodes=15, chain=True)
    assert type(tree.cost) is StepCostModel and type(chain.cost) is StepCostModel
    for policy, shape in ((tree, "tree"), (chain, "chain")):
        _, ran = _run_auto(_cpu_step, 100, policy=policy)
        assert {s for s, _ in ran} == {shape}


def test_the_first_timed_step_is_not_a_sample() -> None:
    # An engine's first step pays one-off costs: at 16 requests at once its 83 ms (two
    # requests, a warm-up tree) had priced every tree 8.6 ms above what later steps measured.
    policy = BudgetPolicy(15, auto=True)
    policy.time_step(19, 0.083, drafting=2, trees=1, tree_rows=15)
    assert policy.cost.samples == 0
    policy.time_step(16, 0.036, drafting=0)
    assert policy.cost.samples == 1


def test_a_class_met_for_the_first_time_starts_at_its_shapes_measured_rate() -> None:
    """A repeated prompt's long match in the shared outputs: its classes were never observed
    (first answers' long matches came from the own context), but long matches of the same
    length and depth were; the new classes start at their rate, not at the 0.5 prior, so a
    busy batch runs their chains long from the first step."""
    model = RowAcceptanceModel(NUM_CLASSES)
    own = [row_class(match_source(CONTEXT, 1, False), 12, d) for d in range(1, 9)]
    shared = [row_class(match_source(SHARED, 1, False), 12, d) for d in range(1, 9)]
    unrelated = [row_class(match_source(SHARED, 1, False), 1, d) for d in range(1, 9)]
    for i in range(300):
        model.record(own, 8 if i % 10 else 3)          # rows accepted ~97% of the time
    assert model.rates(shared) == pytest.approx(model.rates(own), abs=0.06)
    assert model.rates(shared).min() > 0.9
    assert model.rates(unrelated) == pytest.approx([0.5] * 8)   # a shape never observed
    keep, _ = model.leading_surplus(shared, row_price=0.3)
    assert keep == 8
    # the class's own rows then decide: rejected every time, it falls below its shape's rate
    for _ in range(100):
        model.record(shared, 0)
    assert model.rates(shared[:1])[0] < 0.1 < model.rates(own[:1])[0]
