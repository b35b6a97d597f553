"""Finding the Python files to work on (no libcst, no torch)."""

from __future__ import annotations

import os
from pathlib import Path

# Folders nobody wants scanned, as in ruff's default excludes.
SKIPPED_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox", ".nox",
                "node_modules", "build", "dist", "site-packages", ".eggs"}


def discover(paths: list[Path], excluded=lambda path: False, force_exclude: bool = False) -> list[Path]:
    """Files named directly, plus every .py/.pyi file below named folders, sorted, no duplicates.

    ``excluded`` applies to what a folder walk finds, and to files named on the command line
    only with ``force_exclude`` (as in ruff: pre-commit passes files by name).
    """
    found: dict[Path, None] = {}
    for path in paths:
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(
                    d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info") and not excluded(Path(root) / d)
                )
                for name in sorted(files):
                    if name.endswith((".py", ".pyi")) and not excluded(Path(root) / name):
                        found.setdefault(Path(root) / name)
        elif not (force_exclude and excluded(path)):
            found.setdefault(path)
    return list(found)
