"""One-file convert against the parser floor, and added lines against hand conversions.

Run from the repository root after the README's set-up:

    .venv/bin/python bench/bench_convert.py

- convert vs floor: whole processes, best of 7, on each fixtures/e2e script:
  `ddpify convert --diff FILE` against a process that imports libcst, parses FILE and
  resolves the metadata the converter uses (the parser floor issue 12 measures against).
- added lines: lines the conversion adds (difflib), next to two careful hand conversions
  where they exist: bench/hand/<name>.py (torchrun and a world of one only) and
  bench/hand_contract/<name>.py (what the converter promises: torchrun, srun, plain `python`
  on every GPU, and printed training losses averaged over the ranks).
"""

from __future__ import annotations

import difflib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = (
    "import sys, libcst as cst\n"
    "from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider\n"
    "w = MetadataWrapper(cst.parse_module(open(sys.argv[1]).read()))\n"
    "w.resolve_many((QualifiedNameProvider, ScopeProvider, ParentNodeProvider, PositionProvider))\n"
)


def best(command: list[str], runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def count_added(before: str, after: str) -> int:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="")
    return sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))


def added_lines(path: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from ddpify.api import convert_source

    source = path.read_text()
    return count_added(source, convert_source(source, path=path.name).output)


def hand_added(path: Path, folder: str) -> str:
    hand = ROOT / "bench" / folder / path.name
    return str(count_added(path.read_text(), hand.read_text())) if hand.exists() else "-"


def main() -> None:
    ddpify = str(Path(sys.executable).with_name("ddpify"))
    print("| script | lines | convert | parser floor | ratio | added lines | hand (torchrun only) | hand (contract) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted((ROOT / "fixtures" / "e2e").glob("*.py")):
        if path.name.endswith(".ddp.py"):
            continue
        convert = best([ddpify, "convert", "--diff", str(path)])
        floor = best([sys.executable, "-c", FLOOR, str(path)])
        lines = len(path.read_text().splitlines())
        print(f"| {path.name} | {lines} | {convert:.3f} s | {floor:.3f} s | {convert / floor:.2f}x | {added_lines(path)} | {hand_added(path, 'hand')} | {hand_added(path, 'hand_contract')} |")


if __name__ == "__main__":
    main()
