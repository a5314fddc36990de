"""Record the fingerprints of what PTD depends on from released vLLM source distributions.

    pip download vllm==0.33.0 --no-deps --no-binary :all: -d DIR   # or the .tar.gz from PyPI
    python scripts/record_vllm_fingerprints.py DIR/vllm-0.33.0 [DIR/vllm-0.32.0 ...]

Each argument is an unpacked source tree (its top folder holds the `vllm` package); its
version is read from the folder name (vllm-X.Y.Z). Results are merged into
vllm_ptd/data/vllm_fingerprints.json. Run it for every vLLM release the plugin supports.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_ptd.vllm_fingerprints import RECORDED_FILE, file_digests, fingerprints_of_tree


def main(trees: list[str]) -> int:
    data = (json.loads(RECORDED_FILE.read_text()) if RECORDED_FILE.is_file()
            else {"versions": {}})
    for tree in trees:
        match = re.fullmatch(r"vllm-(\d+\.\d+\.\d+)", Path(tree).resolve().name)
        if match is None or not (Path(tree) / "vllm").is_dir():
            print(f"{tree}: not an unpacked vllm-X.Y.Z source tree", file=sys.stderr)
            return 1
        prints = fingerprints_of_tree(tree)
        data["versions"][match.group(1)] = prints
        data.setdefault("files", {})[match.group(1)] = file_digests(tree)
        missing = [name for name, value in prints.items() if value is None]
        print(f"{match.group(1)}: {len(prints) - len(missing)} recorded"
              + (f", absent: {', '.join(missing)}" if missing else ""))
    data["versions"] = dict(sorted(data["versions"].items()))
    data["files"] = dict(sorted(data["files"].items()))
    RECORDED_FILE.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
