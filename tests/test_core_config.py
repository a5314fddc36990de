"""PTDConfig.from_dict: defaults are the paper's; bad input is refused by key name; the
enumerations take names, and their old integer spellings still work."""

from __future__ import annotations

import pytest

from vllm_ptd.config import (
    AUTO,
    CHAIN,
    CPU_DEFAULTS,
    PTD_CONFIG_KEYS,
    TREE,
    PTDConfig,
    markdown_table,
)


def test_defaults_are_the_papers_and_every_field_is_documented():
    cfg = PTDConfig.from_dict({})
    assert (cfg.width, cfg.depth, cfg.num_roots, cfg.pool_cap) == (4, 6, 4, 60)
    # the draft's shape is measured, on every platform (CPU_DEFAULTS does not set it)
    assert (cfg.draft_shape, cfg.adaptive_budget) == (AUTO, True)
    assert "draft_shape" not in CPU_DEFAULTS
    assert set(PTD_CONFIG_KEYS) == set(cfg.__dataclass_fields__)
    assert all(spec.doc for spec in PTD_CONFIG_KEYS.values())


def test_valid_values_are_taken():
    assert PTDConfig.from_dict({"width": 2, "max_nodes": 16}).max_nodes == 16


def test_enumerations_take_names_and_booleans():
    cfg = PTDConfig.from_dict({"draft_shape": "chain", "adaptive_budget": False})
    assert (cfg.draft_shape, cfg.adaptive_budget) == (CHAIN, False)
    assert (TREE, CHAIN, AUTO) == ("tree", "chain", "auto")
    assert PTDConfig.from_dict({"draft_shape": "auto"}).draft_shape == AUTO


@pytest.mark.parametrize(("old", "new"), [
    ({"draft_shape": 0}, ("draft_shape", TREE)),
    ({"draft_shape": 1}, ("draft_shape", CHAIN)),
    ({"adaptive_budget": 0}, ("adaptive_budget", False)),
    ({"adaptive_budget": 1}, ("adaptive_budget", True)),
])
def test_old_integer_spellings_of_the_enumerations_map_to_their_names(old, new):
    key, value = new
    assert getattr(PTDConfig.from_dict(old), key) is value
    assert getattr(PTDConfig(**old), key) is value   # direct construction maps them too


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"widht": 4}, "widht"),
        ({"width": 0}, r"width.*\[1, 64\]"),
        ({"depth": "6"}, "depth.*int"),
        ({"pool_cap": True}, "pool_cap"),
        ({"max_nodes": -1}, "max_nodes"),
        ({"num_roots": 2.0}, "num_roots"),
        ({"draft_shape": "trie"},
         r"'draft_shape' must be one of 'tree', 'chain', 'auto' \(or the old 0, 1\), got 'trie'"),
        ({"draft_shape": 2}, "'draft_shape' must be one of 'tree', 'chain'"),
        ({"draft_shape": True}, "'draft_shape' must be one of 'tree', 'chain'"),
        ({"draft_shape": "Chain"}, "'draft_shape' must be one of"),
        ({"adaptive_budget": 2}, r"'adaptive_budget' must be true or false \(or the old 0, 1\)"),
        ({"adaptive_budget": "true"}, "'adaptive_budget' must be true or false"),
        ({"adaptive_budget": 1.0}, "'adaptive_budget' must be true or false"),
    ],
)
def test_bad_input_raises_value_error_naming_the_key(bad, needle):
    with pytest.raises(ValueError, match=needle):
        PTDConfig.from_dict(bad)


def test_direct_construction_is_validated_too():
    with pytest.raises(ValueError, match="depth"):
        PTDConfig(depth=0)
    with pytest.raises(ValueError, match="draft_shape"):
        PTDConfig(draft_shape="bush")


def test_cpu_defaults_are_valid_keys_and_leave_the_shape_to_the_policy():
    cfg = PTDConfig.from_dict(CPU_DEFAULTS)
    assert cfg.draft_shape == AUTO
    assert (cfg.max_nodes, cfg.max_candidate_nodes) == (15, 10)


def test_the_key_table_has_one_row_per_key_with_what_it_allows_and_its_defaults():
    rows = markdown_table().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == list(PTD_CONFIG_KEYS)
    by_key = {r.split(" | ")[0].strip("| "): r for r in rows}
    assert "| string | tree, chain, auto (old: 0 = tree, 1 = chain) | auto |" \
        in by_key["draft_shape"]
    assert "| bool | true, false (old: 0 = false, 1 = true) | true |" in by_key["adaptive_budget"]
    assert "| int | 0-128 | 15 on CPU, 64 elsewhere |" in by_key["max_nodes"]
    assert "| int | 0-2^63-1 | 0 |" in by_key["seed"]


def test_the_readme_carries_the_key_table_as_generated():
    """README.md's table of keys is `python -m vllm_ptd.config`'s output, verbatim: a key,
    range or default changed in config.py must be pasted into the README again."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme
