"""A project's verdicts: which groups and files are refused or left as they are, and why.

A project converts whole or not at all (DDP210); a group that trains with no sharded loader
is refused (DDP211); a script that only evaluates is left as it is (DDP212), and so is a
module whose DataParallel subclass nothing uses (DDP213).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ddpify.diagnostics import Diagnostic, FileResult, Severity
from ddpify.project.graph import CALL_NAME, ModuleInfo, Project, _trains, _words, module_name


def _leave_all_if_refused(results: dict[Path, FileResult], root: Path, apart: set[Path] = frozenset()) -> None:
    """A project converts whole or not at all. Its modules may meet in ways the analysis
    cannot see (a model class found by importlib, a loader that unwraps `DataParallel`):
    with one file left as DataParallel, the rewrites of the others (a process group set
    up around it, `isinstance(net, DistributedDataParallel)`) would break the program.
    ``apart``: refused files that cannot run with the others (unreadable, imported by none)."""
    refused = sorted(path for path, result in results.items() if result.error and path not in apart)
    if not refused:
        return
    name = refused[0].relative_to(root) if refused[0].is_relative_to(root) else refused[0]
    for path, result in list(results.items()):
        if not result.error and result.changed:
            results[path] = _refusal(result, "DDP210", f"{name} was not converted, and a project converts whole or not at all")


def _class_words(source: str) -> set[str]:
    try:
        return _words(ast.parse(source))
    except SyntaxError:
        return {"<unreadable>"}


def _training_names(members: list[ModuleInfo]) -> set[str]:
    """Functions and methods of the group that train, or call (by name) one that does:
    CenterNet's `Trainer.train` calls `run_epoch`, which calls backward()."""
    training = set().union(*(member.training_defs for member in members))
    uses = {name: words for member in members for name, words in member.def_words.items()}
    grown = True
    while grown:
        grown = False
        for name, words in uses.items():
            if name not in training and words & training:
                training.add(name)
                grown = True
    return training


SUBCLASS_PROBLEM = re.compile(r"class (\w+) subclasses DataParallel")


def _leave_unused_subclasses(members: list[ModuleInfo], entry: ModuleInfo | None, converted: dict) -> None:
    """A vendored package's DataParallel subclass that nothing in the group uses
    (Synchronized-BatchNorm-PyTorch's DataParallelWithCallback beside the
    patch_replication_callback the script calls) does not refuse the project: its module
    is left as it is, said in a warning."""
    for member in members:
        result = converted.get(member.path)
        if member is entry or result is None or not result.error:
            continue
        errors = [d for d in result.diagnostics if d.severity is Severity.ERROR]
        classes = {match.group(1) for d in errors if (match := SUBCLASS_PROBLEM.match(d.message))}
        if not classes or len(classes) != len(errors) or any(d.code.startswith("DDP1") for d in result.diagnostics):
            continue
        uses = [
            line
            for other in members
            if other is not member
            for line in other.source.splitlines()
            if not line.lstrip().startswith(("from ", "import ", "__all__"))
        ]
        if any(re.search(rf"\b{name}\b", line) for line in uses for name in classes) or _built_in(member.source, classes):
            continue
        names = ", ".join(sorted(classes))
        warning = Diagnostic(
            errors[0].line, errors[0].col, "DDP213",
            f"defines DataParallel subclass {names}, which nothing in this project uses: left as it is",
            Severity.WARNING,
        )
        converted[member.path] = FileResult(str(member.path), member.source, member.source, (warning,))


def _built_in(source: str, classes: set[str]) -> bool:
    """Does the module itself build one of ``classes`` (HJL-re-id's ``may_data_parallel(model)``
    returns ``TransparentDataParallel(model)``, and every trainer wraps through it)?"""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    return any(
        isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in classes
        for node in ast.walk(tree)
    )


def _leave_unreached_copy(member: ModuleInfo, converted: dict, sources: dict[Path, str]) -> None:
    """A DataParallel module with no entry point that no script of the project imports, nor
    names as a string (a class path for importlib): an old copy no one runs (W-DCGAN-GP's
    ``temp/attention/train.py``). Refused alone (DDP202) it held the whole project back; it
    is left as it is, said in a warning."""
    result = converted.get(member.path)
    errors = [d for d in result.diagnostics if d.severity is Severity.ERROR] if result is not None else []
    if not errors or any(d.code != "DDP202" for d in errors):
        return
    quoted = re.compile(rf"[\"'](?:[\w.]*\.)?{re.escape(member.name.rpartition('.')[2])}[\"'.]" if "." not in member.name else re.escape(member.name))
    others = {path: source for path, source in sources.items() if path != member.path}
    folder = "/".join(member.name.split(".")[:-1])
    on_path = re.compile(rf"[\"'][./]*{re.escape(folder)}/?[\"']") if folder else None
    if any(quoted.search(source) or on_path and on_path.search(source) for source in others.values()):
        return  # (perhaps found by name at run time, or on a search path added at run time)
    root = Path(member.path).parents[len(member.name.split(".")) - 1]
    if any(_imports(source, module_name(root, path), member.name) for path, source in others.items() if path.suffix == ".py"):
        return  # (a module imports it: dynamic_refused's mymodel.py, itself found by importlib)
    warning = Diagnostic(
        errors[0].line, errors[0].col, "DDP216",
        "no entry point, and no file of this project imports it or names it (a copy no one runs?): left as it is; "
        "the scripts' own files convert without it",
        Severity.WARNING,
    )
    converted[member.path] = FileResult(str(member.path), member.source, member.source, (warning,))


def leave_what_no_training_reaches(project: Project, results: dict[Path, FileResult]) -> None:
    """A refused module that no script that trains imports, directly or not: an evaluation
    helper that wraps for inference (Deep_Metric's Model2Feature.py, imported by test.py alone,
    which trains nothing: DDP212). Its refusal is about code the converted training never runs:
    it is left as it is, said in a warning, and holds back none of the files the training
    scripts run (refused, it held back the whole project: batch 47). A script that runs is
    never left so: its own refusal stands."""
    modules = project.modules_by_path()
    training = [
        info for path, info in modules.items()
        if info.runs and path in results and not any(d.code == "DDP212" for d in results[path].diagnostics)
    ]
    if not training:
        return
    reached = {info.path for info in training} | {module.path for info in training for module in project.reachable(info)}
    importers: dict[Path, list[ModuleInfo]] | None = None  # module -> the modules that import it, directly or not
    for path, result in list(results.items()):
        info = modules.get(path)
        if not result.error or path in reached or info is None or info.runs:
            continue
        if importers is None:
            importers = _importers(project)
        if not _imported_only_by_name(project, info, importers.get(path, [])):
            continue  # (perhaps found by importlib from a name in a string: a training script may run it)
        errors = [d for d in result.diagnostics if d.severity is Severity.ERROR]
        warning = Diagnostic(
            errors[0].line, errors[0].col, "DDP217",
            f"no script that trains imports it, directly or not (it was refused alone: {errors[0].code}): left as it is; "
            "the training scripts' files convert without it",
            Severity.WARNING,
        )
        results[path] = FileResult(str(path), result.source, result.source, (warning,))


def _importers(project: Project) -> dict[Path, list[ModuleInfo]]:
    """Each module of the project -> the modules that import it, directly or not."""
    found: dict[Path, list[ModuleInfo]] = {}
    for name in project.paths:
        module = project.module(name)
        for reached in project.reachable(module):
            found.setdefault(reached.path, []).append(module)
    return found


def _imported_only_by_name(project: Project, info: ModuleInfo, importers: list[ModuleInfo]) -> bool:
    """Does a module of the project import ``info`` by name (directly or not: ``importers``), and
    are it and every module that does so never named in a string (a class path importlib may
    load: dynamic_refused's `importlib.import_module("mymodel")`, whose module imports nets.py)?"""
    if not importers:
        return False
    for module in [info, *importers]:
        last = re.escape(module.name.rpartition(".")[2])
        # (the module's dotted path, or a class in it: not a file of the same name, 'test.txt')
        quoted = re.compile(rf"[\"'](?:[\w.]*\.)?{last}(?:\.[A-Z]\w*)?[\"']")
        if any(quoted.search(source) for path, source in project.sources.items() if path != module.path):
            return False
    return True


def _imports(source: str, importer: str, target: str) -> bool:
    """Does the module ``importer`` import ``target`` (``import nets``, ``from . import nets``,
    ``from models.nets import x``)? Unreadable: it may."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    package = importer.rpartition(".")[0].split(".") if "." in importer else []
    # (a script's own folder is on sys.path: scripts/train.py's `import utils` is scripts/utils.py)
    beside = ".".join(package) + "." if package else ""

    def reaches(name: str, absolute: bool = True) -> bool:
        names = (name, beside + name) if absolute else (name,)
        return any(n == target or n.startswith(target + ".") for n in names)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(reaches(alias.name) for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom):
            above = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*above, *([node.module] if node.module else [])])
            named = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            if any(reaches(name, not node.level) for name in ([base] if base else []) + named):
                return True
    return False


def _evaluates_only(project: Project, entry: ModuleInfo, members: list[ModuleInfo]) -> bool:
    """An evaluation script beside the trainer (HRNet's tools/test.py imports `validate`
    from the module that also holds `train`): it trains nothing itself, never names a
    function or method of the group that trains, and every project function it calls (and
    they call, a few levels down) does neither. A project name that does not resolve to a
    function (a class, an object) may train: not this."""
    if entry.trains or project.training_calls(entry):  # (a trainer picked from a table: `trainer.train(...)`)
        return False
    training = _training_names(members)
    pending, seen = [(entry, entry.source, entry.words)], set()
    while pending:
        module, text, words = pending.pop()
        if words & training:
            return False
        for name in set(CALL_NAME.findall(text)):
            if name.partition(".")[0] not in module.bindings or not project.in_project(module.bindings[name.partition(".")[0]][0]):
                continue  # not a project name
            found = project.resolve(module, name, classes=True)
            if found is None:
                return False
            key = (found[0].name, found[1])
            if key in seen:
                continue
            seen.add(key)
            body = found[0].function_sources.get(found[1]) or found[0].class_sources.get(found[1], "")
            if _trains(body) or len(seen) > 50:
                return False
            words = found[0].def_words.get(found[1]) or _class_words(body)
            pending.append((found[0], body, words))
    return True


def _refusal(result: FileResult, code: str, reason: str) -> FileResult:
    diagnostic = Diagnostic(1, 1, code, reason, Severity.ERROR)
    return FileResult(result.path, result.source, result.source, (diagnostic,), None, f"not converted: {reason}")


def _left_for_evaluation(entry: ModuleInfo) -> FileResult:
    if not entry.parses:  # (pytorch-PersonReID: merge-conflict markers; it was said to train nothing)
        return unreadable_result(entry)
    reason = (
        "uses the project's DataParallel models but trains nothing (no backward() here or in the project "
        "functions it calls): left as it is; it runs as one process, the converted modules allow that"
    )
    diagnostic = Diagnostic(1, 1, "DDP212", reason, Severity.WARNING)
    return FileResult(str(entry.path), entry.source, entry.source, (diagnostic,))


def unreadable_result(entry: ModuleInfo) -> FileResult:
    """What single-file mode says of a file that does not parse (DDP001, Python's position)."""
    import libcst as cst  # (only here: a check or a no-op convert never imports libcst)

    from ddpify.engine import parse_error  # (the engine imports project mode)

    try:
        cst.parse_module(entry.source)
        diagnostic = Diagnostic(1, 1, "DDP001", "cannot parse", Severity.ERROR)
    except cst.ParserSyntaxError as error:
        diagnostic = parse_error(entry.source, error)
    return FileResult(str(entry.path), entry.source, entry.source, (diagnostic,), None, f"not converted: {diagnostic.message}")


def _wraps(result: FileResult) -> bool:
    """A refusal, or a conversion that built DistributedDataParallel."""
    return bool(result.error) or (result.changed and "DistributedDataParallel" in result.output)


def _refuse_together(group: list[Path], results: dict[Path, FileResult], root: Path) -> bool:
    """One refused file leaves every file of its group untouched, each saying why. True if
    that refused a file that was converted."""
    refused = [path for path in group if results[path].error]
    if not refused:
        return False
    name = refused[0].relative_to(root) if refused[0].is_relative_to(root) else refused[0]
    reason = f"{name} works together with this file and was not converted"
    changed = False
    for path in group:
        result = results[path]
        if result.error:
            continue
        results[path] = _refusal(result, "DDP210", reason)
        changed = True
    return changed
