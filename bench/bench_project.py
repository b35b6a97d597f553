"""Project mode against the parser floor, and how often each file is converted.

Run from the repository root after the README's set-up:

    .venv/bin/python bench/bench_project.py [--entries 30] [--rounds 5] [--before PATH]

- generates a project with bench/gen_project.py (80 files: a library and 30 training
  scripts that all import it) in a temporary folder;
- counts, in one process (`--jobs 1`), how often each file is parsed with libcst and how
  often it is rewritten (libcst's `parse_module` and ddpify's transform pipeline, counted
  per file);
- times, alternating A and B in each round (best and median of `--rounds`):
  A: `ddpify convert --diff DIR` as a whole process (start-up and libcst's import included);
  B: the parser floor: one process that imports libcst and, for every .py file of the
  project, parses it (`parse`) and resolves the four metadata providers the converter uses
  (`parse + metadata`, the floor bench_convert.py uses for one file); the sums of the
  per-file times are printed by that process (its import is not in them).
- `--before PATH` also counts and times a checkout of ddpify at PATH (PYTHONPATH=PATH), e.g.
  `git worktree add /tmp/before <commit>` (not timed if it crashes on the project);
- `--local-loaders`: each script builds its own loaders (gen_project.py --local-loaders);
- `--project DIR`: bench a copy of DIR (a real repository) instead of a generated project.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

FLOOR = """
import sys, time
from pathlib import Path
import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider
sums = [0.0] * 4  # wall: parse, metadata; CPU: parse, metadata
for path in sorted(Path(sys.argv[1]).rglob("*.py")):
    source = path.read_text()
    start, cpu = time.perf_counter(), time.process_time()
    module = cst.parse_module(source)
    parsed, parsed_cpu = time.perf_counter(), time.process_time()
    MetadataWrapper(module).resolve_many((QualifiedNameProvider, ScopeProvider, ParentNodeProvider, PositionProvider))
    sums[0] += parsed - start
    sums[1] += time.perf_counter() - start
    sums[2] += parsed_cpu - cpu
    sums[3] += time.process_time() - cpu
print(*sums)
"""

COUNT = """
import collections, inspect, json, sys
from pathlib import Path
import libcst
from ddpify import api
from ddpify.transforms import base

root = Path(sys.argv[1])
files = sorted(root.rglob("*.py"))
by_source = {}
for path in files:
    by_source.setdefault(path.read_text(), []).append(str(path.relative_to(root)))
parsed, rewritten = collections.Counter(), collections.Counter()
parse_module = libcst.parse_module

def counted_parse(source, *args, **kwargs):
    for name in by_source.get(source, ["(not a project file)"]):
        parsed[name] += 1
    return parse_module(source, *args, **kwargs)

libcst.parse_module = counted_parse
init = base.Pipeline.__init__

def counted_pipeline(self, context, transforms):
    rewritten[str(Path(context.path).relative_to(root))] += 1
    init(self, context, transforms)

base.Pipeline.__init__ = counted_pipeline
options = {"jobs": 1} if "jobs" in inspect.signature(api.convert_project).parameters else {}
try:
    results = api.convert_project(root, files, **options)
except Exception as error:
    print(json.dumps({"crash": f"{type(error).__name__}: {error}"}))
    raise SystemExit(0)
print(json.dumps({
    "files": len(files),
    "changed": sum(1 for r in results if r.changed),
    "refused": sum(1 for r in results if r.error),
    "parsed": parsed,
    "rewritten": rewritten,
}))
"""


def run_timed(command: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """Wall time, and CPU time (user + system) of the process and its workers."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def environment(pythonpath: str | None) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def count(project: Path, pythonpath: str | None) -> dict:
    # Run outside any checkout: `python -c` puts the working folder first on the path.
    output = subprocess.run(
        [sys.executable, "-c", COUNT, str(project)], cwd=project.parent, env=environment(pythonpath), capture_output=True, text=True
    )
    if output.returncode:
        raise SystemExit(output.stderr)
    return json.loads(output.stdout)


def describe(counts: dict) -> str:
    if "crash" in counts:
        return f"crashed: {counts['crash']}"
    parsed, rewritten = counts["parsed"], counts["rewritten"]
    return (
        f"{counts['files']} files, {counts['changed']} changed, {counts['refused']} refused; "
        f"libcst parses {sum(parsed.values())} ({len(parsed)} files, at most {max(parsed.values(), default=0)} each); "
        f"rewrites {sum(rewritten.values())} ({len(rewritten)} files, at most {max(rewritten.values(), default=0)} each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="a checkout of an earlier ddpify to count and time too")
    parser.add_argument("--local-loaders", action="store_true", help="gen_project.py --local-loaders")
    parser.add_argument("--project", type=Path, help="bench a copy of this folder instead (a real repository)")
    args = parser.parse_args()
    from gen_project import generate

    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder) / "project"
        if args.project:
            shutil.copytree(args.project, project, ignore=shutil.ignore_patterns(".git"))
        else:
            generate(project, args.entries, args.local_loaders)
        versions = {"this checkout": str(ROOT)}
        if args.before:
            versions["before"] = args.before
        for label, path in list(versions.items()):
            counts = count(project, path)
            print(f"{label}: {describe(counts)}")
            if "crash" in counts:
                del versions[label]
        ddpify = [sys.executable, "-m", "ddpify", "convert", "--diff", str(project)]
        runs = {"this checkout, -j 1": (str(ROOT), ["-j", "1"]), "this checkout (workers: one per CPU)": (str(ROOT), [])}
        runs.update((label, (path, [])) for label, path in versions.items() if label != "this checkout")
        timings: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
        floors: list[tuple[float, ...]] = []
        for _ in range(args.rounds):
            for label, (path, options) in runs.items():
                timings[label].append(run_timed([*ddpify, *options], environment(path), project.parent))
            floor = subprocess.run([sys.executable, "-c", FLOOR, str(project)], capture_output=True, text=True, check=True)
            floors.append(tuple(float(value) for value in floor.stdout.split()))
        parse, metadata, parse_cpu, metadata_cpu = (min(f[i] for f in floors) for i in range(4))
        print(f"parser floor, summed over {len(list(project.rglob('*.py')))} files (best of {args.rounds}): "
              f"parse {parse:.2f} s (CPU {parse_cpu:.2f} s), parse + metadata {metadata:.2f} s (CPU {metadata_cpu:.2f} s)")
        print("| version | convert --diff, wall (best / median) | / parse | / parse + metadata | CPU (best) | / parse | / parse + metadata |")
        print("|---|---|---|---|---|---|---|")
        for label, values in timings.items():
            wall, cpu = min(v[0] for v in values), min(v[1] for v in values)
            median = statistics.median(v[0] for v in values)
            print(f"| {label} | {wall:.2f} s / {median:.2f} s | {wall / parse:.1f}x | {wall / metadata:.2f}x "
                  f"| {cpu:.2f} s | {cpu / parse_cpu:.1f}x | {cpu / metadata_cpu:.2f}x |")


if __name__ == "__main__":
    main()
