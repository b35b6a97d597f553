"""Finding the Python files to work on (no libcst, no torch)."""

from __future__ import annotations

import os
from pathlib import Path

# Folders nobody wants scanned, as in ruff's default excludes.
SKIPPED_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox", ".nox",
                "node_modules", "build", "dist", "site-packages", ".eggs"}


def discover(paths: list[Path]) -> list[Path]:
    """Files named directly, plus every .py/.pyi file below named folders, sorted, no duplicates."""
    found: dict[Path, None] = {}
    for path in paths:
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if name.endswith((".py", ".pyi")):
                        found.setdefault(Path(root) / name)
        else:
            found.setdefault(path)
    return list(found)
