"""The guard against vLLM versions: fingerprints of what the patches touch, refusals that name
the version and the changed function, and a plugin that never breaks plain vLLM."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vllm_ptd.version_check import (
    SKIP_ENV,
    UnsupportedVLLMVersion,
    check_vllm_version,
    compatibility_problem,
)
from vllm_ptd.vllm_fingerprints import (
    REVIEWED_CHANGES,
    TARGETS,
    WRAPPED,
    fingerprint_in_file,
    installed_vllm_root,
    module_file,
    recorded,
    target_name,
)

RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample")


@pytest.fixture
def vllm_copy(tmp_path) -> Path:
    """The installed vLLM's files that hold the fingerprinted definitions, copied."""
    root = installed_vllm_root()
    for module, _ in TARGETS:
        source = module_file(root, module)
        target = tmp_path / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    return tmp_path


def _edit_function(root: Path, module: str, qualname: str, old: str, new: str) -> None:
    path = module_file(root, module)
    text = path.read_text()
    name = qualname.split(".")[-1]
    at = text.index(f"def {name}(")
    end = text.index(old, at)
    path.write_text(text[:end] + new + text[end + len(old):])


def test_installed_vllm_matches_its_recorded_fingerprints():
    assert compatibility_problem() is None
    check_vllm_version()


def test_every_supported_release_is_recorded_for_every_target():
    releases = recorded()
    assert {"0.32.0", "0.33.0"} <= set(releases)
    names = {target_name(m, q) for m, q in TARGETS}
    for fingerprints in releases.values():
        assert set(fingerprints) == names
        assert all(fingerprints.values())


def test_the_fingerprinted_functions_are_exactly_the_patched_ones():
    from vllm_ptd.plugin import register
    from vllm_ptd.vllm_integration.patches import ALL_PATCHES

    register()
    patched = {(p.original.__module__, p.original.__qualname__) for p in ALL_PATCHES}
    assert patched == set(WRAPPED)


def test_what_ptd_wraps_is_unchanged_from_0_32_to_0_33_but_for_reviewed_changes():
    # The releases differ elsewhere (the Triton backend's builder, the runner's drafting
    # entry); a patched function that differs must have been read against its wrapper.
    old, new = recorded()["0.32.0"], recorded()["0.33.0"]
    changed = {target_name(*t) for t in WRAPPED if old[target_name(*t)] != new[target_name(*t)]}
    assert changed == set(REVIEWED_CHANGES)
    assert old != new


def test_a_changed_function_is_named(vllm_copy, monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)
    _edit_function(vllm_copy, *RUNNER, "spec_decode_metadata", "spec_metadata")
    problem = compatibility_problem("0.32.0", vllm_root=vllm_copy)
    assert problem is not None and "GPUModelRunner._sample" in problem
    assert "_prepare_inputs" not in problem and "0.32.0" in problem
    with pytest.raises(UnsupportedVLLMVersion, match="GPUModelRunner._sample"):
        check_vllm_version("0.32.0", vllm_root=vllm_copy)


def test_comments_and_formatting_do_not_count(vllm_copy):
    before = fingerprint_in_file(module_file(vllm_copy, RUNNER[0]), RUNNER[1])
    _edit_function(vllm_copy, *RUNNER, "(", "(  # a comment, and a line break\n")
    assert fingerprint_in_file(module_file(vllm_copy, RUNNER[0]), RUNNER[1]) == before
    assert compatibility_problem("0.32.0", vllm_root=vllm_copy) is None


def test_an_unrecorded_patch_release_is_accepted_when_nothing_ptd_touches_changed(vllm_copy):
    assert compatibility_problem("0.32.7", vllm_root=vllm_copy) is None
    _edit_function(vllm_copy, *RUNNER, "spec_decode_metadata", "spec_metadata")
    assert "GPUModelRunner._sample" in compatibility_problem("0.32.7", vllm_root=vllm_copy)


@pytest.mark.parametrize("version", ["0.34.0", "0.31.2", "1.0.0"])
def test_unknown_versions_are_refused_naming_them_and_the_supported_ones(version, monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)
    with pytest.raises(UnsupportedVLLMVersion) as err:
        check_vllm_version(version)
    assert version in str(err.value) and "0.32.x" in str(err.value) and "0.33.x" in str(err.value)


def test_the_override_variable_lets_an_unknown_version_through(monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "1")
    check_vllm_version("0.34.0")


def test_a_failing_patch_leaves_vllm_as_it_was(monkeypatch):
    from vllm_ptd import patching
    from vllm_ptd.patching import Patch, apply_together

    class Holder:
        first = "vllm's first"
        second = "vllm's second"

    monkeypatch.setattr(patching.importlib, "import_module", lambda name: Holder)

    def boom(original):
        raise RuntimeError("does not fit")

    patches = [Patch("fake", "", "first", lambda original: "patched", why="test"),
               Patch("fake", "", "second", boom, why="test")]
    with pytest.raises(RuntimeError, match="does not fit"):
        apply_together(patches)
    assert (Holder.first, Holder.second) == ("vllm's first", "vllm's second")
    assert not any(p.key[0] == "fake" for p in patching.applied_patches())
