"""Benchmark (not a timed test): `ddpify check` over a large real tree vs ruff, and start-up.

    .venv/bin/pip install -q ruff && .venv/bin/python bench/bench_check.py

Checks the installed torch package's Python files with `ddpify check` and with
`ruff check --select F401` in the same run, then times a one-file `convert --diff` and
`ddpify --help` as whole processes. Prints a Markdown table for docs/performance.md.
Targets: tree check within 3x ruff; one-file convert and --help under 0.3 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def best_of(command: list[str], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    import torch  # only to find the tree; ddpify itself never imports it

    tree = Path(torch.__file__).parent
    files = sum(1 for _ in tree.rglob("*.py"))
    ddpify = str(BIN / "ddpify")
    ruff = shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
    rows = [("files in tree", str(files), "")]
    check = best_of([ddpify, "check", "--exit-zero", "--output-format", "concise", str(tree)])
    rows.append(("`ddpify check` torch tree", f"{check:.2f} s", f"{os.cpu_count()} workers"))
    if ruff:
        baseline = best_of([ruff, "check", "--select", "F401", "--exit-zero", "--no-cache", "--quiet", str(tree)])
        rows.append(("`ruff check --select F401` torch tree", f"{baseline:.2f} s", f"ratio {check / baseline:.2f}x"))
    script = ROOT / "fixtures" / "e2e" / "fashion_mnist.py"
    rows.append(("`ddpify convert --diff` one file", f"{best_of([ddpify, 'convert', '--diff', str(script)], 5):.3f} s", "whole process"))
    already = ROOT / "fixtures" / "noop" / "already_ddp.py"  # never says DataParallel: no libcst import
    rows.append(("`ddpify convert --diff` DDP file", f"{best_of([ddpify, 'convert', '--diff', str(already)], 5):.3f} s", "whole process"))
    rows.append(("`ddpify check` one file", f"{best_of([ddpify, 'check', '--exit-zero', str(script)], 5):.3f} s", "whole process"))
    rows.append(("`ddpify --help`", f"{best_of([ddpify, '--help'], 5):.3f} s", "whole process"))
    engine = [sys.executable, "-c", "import ddpify.engine"]
    rows.append(("`import ddpify.engine` (libcst)", f"{best_of(engine, 5):.3f} s", "whole process"))
    print("| measurement | time | note |\n|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} |")


if __name__ == "__main__":
    main()
