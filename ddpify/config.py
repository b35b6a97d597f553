"""``[tool.ddpify]`` in pyproject.toml, found by walking up from the paths given."""

from __future__ import annotations

import fnmatch
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10: tomli is a dependency there
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    root: Path
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    per_process_batch: bool = False
    self_check: bool = False

    def excluded(self, path: Path) -> bool:
        """Glob match on the path relative to the project root, or on any of its parts."""
        if not self.exclude:
            return False
        relative = self.relative(path)
        parts = relative.split("/")
        return any(fnmatch.fnmatch(relative, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in self.exclude)

    def ignores_for(self, path: Path) -> tuple[str, ...]:
        if not self.per_file_ignores:
            return ()
        relative = self.relative(path)
        return tuple(code for pattern, codes in self.per_file_ignores.items() if fnmatch.fnmatch(relative, pattern) for code in codes)

    def relative(self, path: Path) -> str:
        """The path relative to the project root, posix style; as given when outside it."""
        absolute = Path(os.path.abspath(path))  # no file-system calls for the usual case
        if not absolute.is_relative_to(self.resolved_root):
            absolute = path.resolve()  # reached through a symbolic link
        try:
            return absolute.relative_to(self.resolved_root).as_posix()
        except ValueError:
            return path.as_posix()

    @functools.cached_property
    def resolved_root(self) -> Path:
        return self.root.resolve()


KNOWN = {"select", "ignore", "exclude", "extend-exclude", "per-file-ignores", "per-process-batch", "self-check"}


def find_config(paths: list[Path]) -> Config:
    start = (paths[0] if paths else Path.cwd()).resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return load(candidate)
    return Config(root=Path.cwd())


def load(pyproject: Path) -> Config:
    if tomllib is None:
        return Config(root=pyproject.parent)
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{pyproject}: {error}") from error
    section = data.get("tool", {}).get("ddpify", {})
    unknown = set(section) - KNOWN
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.ddpify] keys: {', '.join(sorted(unknown))}")
    return Config(
        root=pyproject.parent,
        select=tuple(section.get("select", ())),
        ignore=tuple(section.get("ignore", ())),
        exclude=tuple(section.get("exclude", ())) + tuple(section.get("extend-exclude", ())),
        per_file_ignores={k: tuple(v) for k, v in section.get("per-file-ignores", {}).items()},
        per_process_batch=bool(section.get("per-process-batch", False)),
        self_check=bool(section.get("self-check", False)),
    )
