"""The files of a project conversion (ddpify.project), each parsed, walked and rewritten once:
in this process, or spread over worker processes.

Each file lives in one place for the whole run (an ``engine.FileConversion``: its tree and
metadata never travel). Project mode asks it, by path, what it learns under some links
(``learn``, small and synchronous: loaders are routed between modules one question at a
time) and, once a group of files is routed, for their rewrites (``rewrite``, batched: the
workers rewrite their files at the same time). ``load`` parses and walks files ahead, in
parallel, before the routing asks about them.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from pathlib import Path

from ddpify.diagnostics import ConvertOptions, FileResult, ProjectLinks

# Worker processes are started for projects of this many files (auto mode; an explicit
# --jobs N starts them from two files).
AUTO_WORKER_FILES = 8

Load = tuple[str, str, ProjectLinks]  # path, source, the links its first question will come with
Rewrite = tuple[str, ConvertOptions, str, ProjectLinks]  # path, options, role, links


class LocalFiles:
    """Every file in this process."""

    def __init__(self) -> None:
        self._files: dict[str, object] = {}
        self.sources: dict[str, str] = {}

    def _file(self, path: str):
        from ddpify.engine import FileConversion

        if path not in self._files:
            self._files[path] = FileConversion(path, self.sources[path])
        return self._files[path]

    def load(self, items: Sequence[Load]) -> list:
        """Parse and walk each file; what it learns under its links (engine.Learned)."""
        learned = []
        for path, source, links in items:
            self.sources.setdefault(path, source)
            learned.append(self._file(path).learn(links))  # the walk, and the resolution the first question needs
        return learned

    def learn(self, path: str, source: str, links: ProjectLinks):
        self.sources.setdefault(path, source)
        return self._file(path).learn(links)

    def rewrite(self, items: Sequence[Rewrite]) -> list[FileResult]:
        return [self._file(path).rewrite(options, role, links) for path, options, role, links in items]

    def close(self) -> None:
        self._files.clear()


def _serve(connection) -> None:
    """A worker: holds its files and answers (operation, payload) messages until told to stop
    (a forked worker holds copies of the other pipes' ends: end of file may never come)."""
    import ddpify.engine  # noqa: F401  (libcst and the transforms, before the first file comes)

    files = LocalFiles()
    while True:
        try:
            operation, payload = connection.recv()
        except EOFError:
            return
        if operation == "stop":
            return
        try:
            answer = getattr(files, operation)(*payload)
            connection.send(("ok", answer))
        except Exception:  # a bug: reported in the parent with the worker's traceback
            connection.send(("error", traceback.format_exc()))


class WorkerFiles:
    """Files spread over worker processes (forked: libcst is imported once)."""

    def __init__(self, workers: int) -> None:
        import multiprocessing

        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        self._connections = []
        self._processes = []
        for _ in range(workers):
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child,), daemon=True)
            process.start()
            child.close()
            self._connections.append(parent)
            self._processes.append(process)
        self._owner: dict[str, int] = {}  # path -> worker
        self._load = [0] * workers  # bytes of source each worker holds

    def _ask(self, worker: int, operation: str, *payload):
        self._connections[worker].send((operation, payload))
        return self._answer(worker)

    def _answer(self, worker: int):
        status, answer = self._connections[worker].recv()
        if status == "error":
            raise RuntimeError(f"ddpify worker failed:\n{answer}")
        return answer

    def _place(self, path: str, source: str) -> int:
        worker = min(range(len(self._load)), key=self._load.__getitem__)
        self._owner[path] = worker
        self._load[worker] += len(source) + 1
        return worker

    def load(self, items: Sequence[Load]) -> list:
        batches: dict[int, list[int]] = {}
        for index in sorted(range(len(items)), key=lambda index: -len(items[index][1])):  # largest first: even shares
            path, source, _ = items[index]
            worker = self._owner[path] if path in self._owner else self._place(path, source)
            batches.setdefault(worker, []).append(index)
        for worker, indices in batches.items():
            self._connections[worker].send(("load", ([items[index] for index in indices],)))
        learned: list = [None] * len(items)
        for worker, indices in batches.items():
            for index, answer in zip(indices, self._answer(worker)):
                learned[index] = answer
        return learned

    def learn(self, path: str, source: str, links: ProjectLinks):
        if path not in self._owner:  # not loaded ahead: it goes to a worker with its source
            return self._ask(self._place(path, source), "learn", path, source, links)
        return self._ask(self._owner[path], "learn", path, "", links)

    def rewrite(self, items: Sequence[Rewrite]) -> list[FileResult]:
        batches: dict[int, list[int]] = {}
        for index, (path, *_rest) in enumerate(items):
            batches.setdefault(self._owner[path], []).append(index)
        for worker, indices in batches.items():
            self._connections[worker].send(("rewrite", ([items[i] for i in indices],)))
        results: list[FileResult | None] = [None] * len(items)
        for worker, indices in batches.items():
            for index, result in zip(indices, self._answer(worker)):
                results[index] = result
        return results

    def close(self) -> None:
        for connection in self._connections:
            try:
                connection.send(("stop", ()))
            except OSError:  # the worker is gone already
                pass
            connection.close()
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


def open_files(paths: Sequence[Path], jobs: int) -> LocalFiles | WorkerFiles:
    """Workers where they may pay for themselves: several CPUs and enough files (``paths``:
    the project's Python files; only those on the conversion path are parsed)."""
    cpus = jobs or os.cpu_count() or 1
    enough = len(paths) >= (2 if jobs > 1 else AUTO_WORKER_FILES)
    if jobs == 1 or cpus < 2 or not enough:
        return LocalFiles()
    return WorkerFiles(min(cpus, len(paths)))
