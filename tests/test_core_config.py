"""PTDConfig.from_dict: defaults are the paper's; bad input is refused by key name."""

from __future__ import annotations

import pytest

from vllm_ptd.config import PTD_CONFIG_KEYS, PTDConfig


def test_defaults_are_the_papers_and_every_field_is_documented():
    cfg = PTDConfig.from_dict({})
    assert (cfg.width, cfg.depth, cfg.num_roots, cfg.pool_cap) == (4, 6, 4, 60)
    assert set(PTD_CONFIG_KEYS) == set(cfg.__dataclass_fields__)


def test_valid_values_are_taken():
    assert PTDConfig.from_dict({"width": 2, "max_nodes": 16}).max_nodes == 16


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"widht": 4}, "widht"),
        ({"width": 0}, r"width.*\[1, 64\]"),
        ({"depth": "6"}, "depth.*int"),
        ({"pool_cap": True}, "pool_cap"),
        ({"max_nodes": -1}, "max_nodes"),
        ({"num_roots": 2.0}, "num_roots"),
    ],
)
def test_bad_input_raises_value_error_naming_the_key(bad, needle):
    with pytest.raises(ValueError, match=needle):
        PTDConfig.from_dict(bad)


def test_direct_construction_is_validated_too():
    with pytest.raises(ValueError, match="depth"):
        PTDConfig(depth=0)
