"""Project mode: ``ddpify convert DIR`` converts a project with one view across its files.

Real DataParallel code is spread over a project: the entry script parses arguments and
calls a trainer in another module, or trains a model that a factory in ``models/`` wraps
on loaders that a builder in ``data/`` returns, while utils print and save. Converted file
by file, the module that wraps is refused (no entry point for the set-up) and the entry
script has nothing to convert. Here every file gets a role:

- **script**: a file that wraps with DataParallel and runs as a script (a ``__main__``
  block or module-level training): converted as on its own;
- **entry**: a script that does not wrap but imports project modules that do: gets the
  process-group set-up and the launch line; if it trains (the model came from a factory),
  its training loaders are sharded and its side effects guarded as in a script;
- **library**: a module imported by a script: one that wraps (a factory, a trainer class),
  trains, builds loaders another module trains on, or prints and saves (utils). Converted
  without set-up (its code runs after the entry's ``ddp_setup()``), with only the helpers
  it uses, nothing guarded at import time and no barrier (its callers are not in sight).

A loader that a function of another module returns (``train_loader, val_loader =
build_loaders(args)``) is sharded where that function builds it and gets ``set_epoch``
where it is iterated: the training module is converted first and says which functions'
results it trains on; those modules are then converted with that knowledge.

A project is converted whole or not at all: if one of its files is refused, every file is
left untouched (DDP210; a converted library under an unconverted entry would fail at the
first collective, and modules meet in ways the import graph does not show, such as a model
class found by importlib). ``--allow-partial`` converts the rest.

The import graph comes from :mod:`ast` (fast, no libcst), parsed lazily: scripts and
DataParallel modules first, then what they import. Conversion comes from the engine.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpify.diagnostics import ENTRY, LIBRARY, SCRIPT, ConvertOptions, Diagnostic, FileResult, ProjectLinks, Severity
from ddpify.names import mentions_data_parallel
# A library module is worth converting when its functions print, save or write files, or
# pick a GPU by index (every rank would use that one).
TOP_LEVEL_LOOP = re.compile(r"^(?:for|while|if|with|try)\b", re.MULTILINE)  # maybe a flat script (see _loops_at_top_level)
BACKWARD = re.compile(r"\.backward\s*\(")
TRAINING_STEP = re.compile(r"([\w.]*)\.(backward|step)\s*\(")  # not `scheduler.step()`
SIDE_EFFECT_WORDS = (
    "print(", "torch.save(", ".save(", "open(", "tqdm", "logging", "shutil.", "cuda:", "set_device", ".cuda(",
    "SummaryWriter", "wandb", "mkdir(", "makedirs(", "save_image", "imwrite", "imsave", "savefig", ".write(",
)


@dataclass
class ModuleInfo:
    path: Path
    name: str  # dotted, relative to the project root
    source: str
    imports: set[str] = field(default_factory=set)  # project modules it imports
    imported_names: set[str] = field(default_factory=set)  # names bound from the project's modules
    # name -> (module, attribute): `from data import build` -> ("data", "build"); `import data`
    # -> ("data", None)
    bindings: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)  # defined at the top level
    function_sources: dict[str, str] = field(default_factory=dict)  # their text
    class_sources: dict[str, str] = field(default_factory=dict)  # top-level classes' text
    training_defs: set[str] = field(default_factory=set)  # functions and methods (any depth) that train
    # the names every function and method (by name) uses, and the whole module's: code, not strings
    def_words: dict[str, set[str]] = field(default_factory=dict)
    words: set[str] = field(default_factory=set)
    runs: bool = False  # a `__main__` block
    wraps: bool = False  # says DataParallel
    trains: bool = False  # calls .backward() or .step()
    # `importlib.import_module("models." + name)`: every project module under "models."
    dynamic_prefixes: set[str] = field(default_factory=set)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_module(root: Path, path: Path, source: str) -> ModuleInfo:
    info = ModuleInfo(
        path, module_name(root, path), source, wraps=mentions_data_parallel(source), trains=_trains(source)
    )
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return info
    package = info.name.split(".") if path.name == "__init__.py" else info.name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            info.imports.update(alias.name for alias in node.names)
            for alias in node.names:  # `import a.b` binds `a`; `import a.b as c` binds `c` to a.b
                info.bindings[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0], None
                )
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            info.imports.add(module)
            info.imports.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import mod`
            for alias in node.names:
                info.bindings[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.If) and _is_main_test(node.test):
            info.runs = True
        elif isinstance(node, ast.Call) and (prefix := _dynamic_import_prefix(node)):
            info.dynamic_prefixes.add(prefix)
    # A flat script (no `__main__` block) runs its loops at the top level.
    info.runs = info.runs or _loops_at_top_level(tree.body)
    defined = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    info.functions = {node.name for node in defined}
    info.function_sources = {node.name: ast.get_source_segment(source, node) or "" for node in defined}
    info.class_sources = {
        node.name: ast.get_source_segment(source, node) or "" for node in tree.body if isinstance(node, ast.ClassDef)
    }
    functions_anywhere = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    info.training_defs = {node.name for node in functions_anywhere if _trains(ast.get_source_segment(source, node) or "")}
    info.def_words = {node.name: _words(node) for node in functions_anywhere}
    info.words = _words(tree)
    return info


def _dynamic_import_prefix(call: ast.Call) -> str | None:
    """``importlib.import_module("models." + name)`` (or an f-string, ``__import__``): the
    module name's constant start, if it names a package ("models.")."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not call.args:
        return None
    name = call.args[0]
    while isinstance(name, ast.BinOp) and isinstance(name.op, ast.Add):
        name = name.left
    if isinstance(name, ast.JoinedStr) and name.values:
        name = name.values[0]
    if isinstance(name, ast.Constant) and isinstance(name.value, str) and "." in name.value:
        return name.value[: name.value.rindex(".") + 1]
    return None


def _loops_at_top_level(body: list[ast.stmt]) -> bool:
    """A loop that runs at import: at the top level, or in a top-level `if`/`with`/`try`
    (EDSR's main.py: `if checkpoint.ok: while not t.terminate(): ...`)."""
    for node in body:
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            return True
        blocks = [getattr(node, name, []) for name in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(node, "handlers", [])]
        if isinstance(node, (ast.If, ast.With, ast.Try)) and any(_loops_at_top_level(block) for block in blocks):
            return True
    return False


def _words(node: ast.AST) -> set[str]:
    """The names and attribute names a piece of code uses (not what its strings say)."""
    return {
        found.id if isinstance(found, ast.Name) else found.attr
        for found in ast.walk(node)
        if isinstance(found, (ast.Name, ast.Attribute))
    }


def _trains(source: str) -> bool:
    """Calls ``.backward()``, or ``.step()`` on something that is not a scheduler."""
    return any(
        method == "backward" or not any(word in receiver.lower() for word in ("sched", "warmup"))
        for receiver, method in TRAINING_STEP.findall(source)
    )


def _is_main_test(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


class Project:
    """The project's modules and who imports whom (only modules inside the project). Files
    are parsed lazily: scripts and DataParallel modules first, then what they import."""

    def __init__(self, root: Path, sources: dict[Path, str]) -> None:
        self.root = root
        self.sources = sources
        self.paths = {module_name(root, path): path for path in sources if path.suffix == ".py"}
        self._read: dict[str, ModuleInfo] = {}

    def in_project(self, module: str) -> bool:
        return module in self.paths or any(other.startswith(module + ".") for other in self.paths)

    def modules_by_path(self) -> dict[Path, ModuleInfo]:
        return {info.path: info for info in self._read.values()}

    def module(self, name: str) -> ModuleInfo:
        if name not in self._read:
            path = self.paths[name]
            info = read_module(self.root, path, self.sources[path])
            self._follow_search_path(info)
            info.imports |= {other for other in self.paths for prefix in info.dynamic_prefixes if other.startswith(prefix)}
            info.imports = {other for other in info.imports if other in self.paths and other != name}
            # Only names bound from the project's own modules (calls through them may train).
            info.imported_names = {
                bound
                for bound, (module, attribute) in info.bindings.items()
                if self.in_project(module) and (module, attribute) != (name, None)
            }
            self._read[name] = info
        return self._read[name]

    def _follow_search_path(self, info: ModuleInfo) -> None:
        """Imports that name a project module as Python finds it at run time: a sibling of
        the script (`import _init_paths` in tools/) or a folder the script puts on sys.path
        (`from core.function import train` with lib/ added by _init_paths: lib.core.function)."""
        canonical = {module: self._located(info, module) for module in info.imports}
        # A folder found on the search path for `core.function` (lib/) also holds `dataset`
        # in `import dataset`; a bare name alone could be a library (`import logging`).
        folders = {found[: -len(module) - 1] for module, found in canonical.items() if found.endswith("." + module)}
        for module, found in canonical.items():
            if found == module and "." not in module and not self.in_project(module):
                places = [folder for folder in folders if self.in_project(f"{folder}.{module}")]
                canonical[module] = f"{places[0]}.{module}" if len(places) == 1 else module
        info.imports = {canonical[module] for module in info.imports}
        info.bindings = {
            bound: (canonical.get(module) or self._located(info, module), attribute)
            for bound, (module, attribute) in info.bindings.items()
        }

    def _located(self, info: ModuleInfo, module: str) -> str:
        if not module or self.in_project(module):
            return module
        package = info.name.rpartition(".")[0]
        if package and self.in_project(f"{package}.{module}"):
            return f"{package}.{module}"
        if "." not in module:
            return module  # `import logging` is not utils/logging.py
        folders = {name.rpartition("." + module)[0] for name in self._dotted_names if name.endswith("." + module)}
        return f"{folders.pop()}.{module}" if len(folders) == 1 else module

    @property
    def _dotted_names(self) -> set[str]:
        """Every module and package name of the project (a.b.c gives a, a.b and a.b.c)."""
        if not hasattr(self, "_names_cache"):
            self._names_cache = {".".join(name.split(".")[: i + 1]) for name in self.paths for i in range(name.count(".") + 1)}
        return self._names_cache

    def candidates(self) -> list[ModuleInfo]:
        """Scripts and DataParallel modules (a text pre-filter before any parse)."""
        return [
            self.module(name)
            for name, path in self.paths.items()
            if "__main__" in self.sources[path]
            or mentions_data_parallel(self.sources[path])
            or TOP_LEVEL_LOOP.search(self.sources[path])
        ]

    def reachable(self, info: ModuleInfo) -> list[ModuleInfo]:
        """The project modules this one imports, directly or not (itself excluded)."""
        seen: dict[str, ModuleInfo] = {}
        stack = list(info.imports)
        while stack:
            name = stack.pop()
            if name in seen or name == info.name:
                continue
            seen[name] = self.module(name)
            stack.extend(seen[name].imports)
        return sorted(seen.values(), key=lambda module: str(module.path))

    def resolve(self, info: ModuleInfo, dotted: str, classes: bool = False) -> tuple[ModuleInfo, str] | None:
        """The project module and top-level function (or, with ``classes``, class) a dotted
        call name in ``info`` refers to (``build_loaders``, ``data.build_loaders``),
        following re-exports."""
        head, _, rest = dotted.partition(".")
        module, attribute = info.bindings.get(head, (None, None))
        if module is None:
            return None
        if attribute is not None:
            if f"{module}.{attribute}" in self.paths:  # `from pkg import mod`: mod.function
                module, attribute = f"{module}.{attribute}", None
        path = [*([attribute] if attribute else []), *(rest.split(".") if rest else [])]
        while len(path) > 1 and f"{module}.{path[0]}" in self.paths:
            module, path = f"{module}.{path[0]}", path[1:]
        if len(path) != 1 or module not in self.paths:
            return None
        for _ in range(5):  # `from .loaders import build_loaders` in a package's __init__
            target = self.module(module)
            if path[0] in target.functions or (classes and path[0] in target.class_sources):
                return target, path[0]
            module, attribute = target.bindings.get(path[0], (None, None))
            if module not in self.paths or attribute is None:
                return None
            path = [attribute]
        return None

    def project_names(self, info: ModuleInfo) -> frozenset[str]:
        """Names this module binds from other project modules (calls to them may train);
        not those that only pass a library's name on (`from dataset import DataLoader`)."""
        reexported = {bound for bound in info.imported_names if self.library_name(info, bound)}
        return frozenset(info.imported_names - reexported)

    def training_calls(self, info: ModuleInfo) -> frozenset[str]:
        """Names called here of other modules' top-level functions that run a training step."""
        found = set()
        for name in set(CALL_NAME.findall(info.source)):
            target = self.resolve(info, name)
            if target is not None and target[0] is not info and _trains(target[0].function_sources.get(target[1], "")):
                found.add(name)
        return frozenset(found)

    def reexports(self, info: ModuleInfo) -> dict[str, str]:
        """Qualified names (as libcst spells them here) of library names that a project
        module passes on: `from dataset import DataLoader` -> torch.utils.data.DataLoader."""
        found = {}
        for bound, (module, attribute) in info.bindings.items():
            library = self.library_name(info, bound)
            if library and attribute:
                written = module.split(".")
                for start in range(len(written)):  # written as imported, before _follow_search_path
                    found[".".join([*written[start:], attribute])] = library
        return found

    def library_name(self, info: ModuleInfo, bound: str) -> str | None:
        module, attribute = info.bindings.get(bound, (None, None))
        for _ in range(5):
            if module is None or attribute is None or module not in self.paths or module == info.name:
                return None
            target = self.module(module)
            if attribute in target.functions or f"{module}.{attribute}" in self.paths:
                return None
            module, attribute = target.bindings.get(attribute, (None, None))
            if module is not None and not self.in_project(module):
                return f"{module}.{attribute}" if attribute else module
        return None


def convert_project(root: Path, sources: dict[Path, str], options: ConvertOptions) -> list[FileResult]:
    """Convert every file of the project; results in the order of ``sources``."""
    project = Project(root, sources)
    # ddpify's own output (converted earlier): nothing to convert, as for a single file
    results: dict[Path, FileResult] = {
        path: FileResult(str(path), source, source) for path, source in sources.items() if ALREADY_CONVERTED.search(source)
    }
    candidates = project.candidates()
    groups = [group for entry in candidates if entry.runs and (group := _convert_group(project, entry, options, results))]
    while any(_refuse_together(group, results, root) for group in groups):
        pass  # a module shared by two groups, refused in one: the other goes too
    for info in candidates:  # a DataParallel module no script of the project imports
        if info.path not in results and info.wraps:
            alone = {info.path: _convert(info, SCRIPT, options, ProjectLinks())}
            _leave_unused_subclasses([info], None, alone)  # a vendored subclass nothing imports
            results[info.path] = alone[info.path]
    if not options.allow_partial:
        _leave_all_if_refused(results, root)
    return [results.get(path) or FileResult(str(path), source, source) for path, source in sources.items()]


def _leave_all_if_refused(results: dict[Path, FileResult], root: Path) -> None:
    """A project converts whole or not at all. Its modules may meet in ways the analysis
    cannot see (a model class found by importlib, a loader that unwraps `DataParallel`):
    with one file left as DataParallel, the rewrites of the others (a process group set
    up around it, `isinstance(net, DistributedDataParallel)`) would break the program."""
    refused = sorted(path for path, result in results.items() if result.error)
    if not refused:
        return
    name = refused[0].relative_to(root) if refused[0].is_relative_to(root) else refused[0]
    for path, result in list(results.items()):
        if not result.error and result.changed:
            results[path] = _refusal(result, "DDP210", f"{name} was not converted, and a project converts whole or not at all")


def _convert_group(project: Project, entry: ModuleInfo, options: ConvertOptions, results: dict) -> list[Path]:
    """The entry script and the project modules it imports: converted together (or none:
    see _refuse_together). Returns the group's files; none if it is not a DataParallel one."""
    if ALREADY_CONVERTED.search(entry.source):
        return []  # ddpify's own output: its modules were converted with it
    members = [entry, *project.reachable(entry)]
    if not any(member.wraps for member in members):
        return []
    trains = any(BACKWARD.search(member.source) for member in members)
    if len(members) > 1 and (not trains or _evaluates_only(project, entry, members)):
        # Evaluates or exports with the project's models: nothing to shard or synchronise.
        # It stays as it is (modules converted for a training script allow a process that
        # set up no group). A script on its own converts as it would alone.
        results.setdefault(entry.path, _left_for_evaluation(entry))
        return []
    converted: dict[Path, FileResult] = {}
    roles: dict[Path, str] = {}
    links: dict[Path, ProjectLinks] = {}
    for member in members:
        if member.path in results:
            converted[member.path] = results[member.path]
            continue
        links[member.path] = ProjectLinks(
            names=project.project_names(member),
            reexports=project.reexports(member),
            training_calls=project.training_calls(member),
            trains_elsewhere=any(other.trains for other in members if other is not member),
        )
        if member is entry:
            roles[member.path] = ENTRY  # the engine makes it a script if it wraps
        elif not member.runs or not (member.wraps or member.trains):
            # A helper with a self-test `__main__` block is still this script's library.
            roles[member.path] = LIBRARY
        else:
            continue  # another script: its own group
        if member is entry or member.wraps or member.trains or _has_side_effects(member.source):
            converted[member.path] = _convert(member, roles[member.path], options, links[member.path])
    # A loop over a loader parameter (`train_one_epoch(model, loader)` in engine.py): the
    # callers shard what they pass.
    for path in _route_parameters(project, members, links, converted):
        converted[path] = _convert(project.modules_by_path()[path], roles[path], options, links[path])
    # A loader another module's builder returns: that module shards it where it builds it.
    builders: dict[Path, dict[str, set[int | None]]] = {}  # module -> its loader functions to shard
    for path, link in links.items():
        for foreign in link.foreign_loaders:
            _route(project, project.modules_by_path()[path], foreign, builders, converted, options)
    for path, functions in builders.items():
        links[path].loader_functions = functions
        converted[path] = _convert(project.modules_by_path()[path], roles.get(path, LIBRARY), options, links[path])
    _leave_unused_subclasses(members, entry, converted)
    if not any(_wraps(result) for result in converted.values()):
        return []  # DataParallel only named (isinstance checks): not a DataParallel project
    entry_result = converted[entry.path]
    if trains and not any(result.error for result in converted.values()) and not any(
        "DistributedSampler" in result.output for result in converted.values()
    ):
        reason = (
            "the project's model is wrapped in DistributedDataParallel, but no training DataLoader was found "
            "sharded in this script or the modules it imports (built in a class, loaded dynamically, or in a "
            "module ddpify cannot follow): every rank would train on all the data"
        )
        if options.allow_partial:
            warning = Diagnostic(1, 1, "DDP211", f"{reason} (converted anyway: --allow-partial)", Severity.WARNING)
            converted[entry.path] = replace(entry_result, diagnostics=(*entry_result.diagnostics, warning))
        else:
            converted[entry.path] = _refusal(entry_result, "DDP211", reason)
    elif not entry_result.error and "ddp_setup()" not in entry_result.output:
        # Modules converted under a script that sets nothing up would fail at their first
        # collective: refuse the entry, and so the group.
        reason = "this script runs project modules that use DistributedDataParallel, but it could not be given the set-up"
        converted[entry.path] = _refusal(entry_result, "DDP210", reason)
    results.update(converted)
    return list(converted)


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
        if any(re.search(rf"\b{name}\b", line) for line in uses for name in classes):
            continue
        names = ", ".join(sorted(classes))
        warning = Diagnostic(
            errors[0].line, errors[0].col, "DDP213",
            f"defines DataParallel subclass {names}, which nothing in this project uses: left as it is",
            Severity.WARNING,
        )
        converted[member.path] = FileResult(str(member.path), member.source, member.source, (warning,))


def _evaluates_only(project: Project, entry: ModuleInfo, members: list[ModuleInfo]) -> bool:
    """An evaluation script beside the trainer (HRNet's tools/test.py imports `validate`
    from the module that also holds `train`): it trains nothing itself, never names a
    function or method of the group that trains, and every project function it calls (and
    they call, a few levels down) does neither. A project name that does not resolve to a
    function (a class, an object) may train: not this."""
    if entry.trains:
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
    reason = (
        "uses the project's DataParallel models but trains nothing (no backward() here or in the project "
        "functions it calls): left as it is; it runs as one process, the converted modules allow that"
    )
    diagnostic = Diagnostic(1, 1, "DDP212", reason, Severity.WARNING)
    return FileResult(str(entry.path), entry.source, entry.source, (diagnostic,))


def _convert(info: ModuleInfo, role: str, options: ConvertOptions, links: ProjectLinks) -> FileResult:
    """One file of a group; what the engine learns back lands in ``links`` (cleared first:
    a file may be converted again with more knowledge)."""
    from ddpify.engine import convert_text

    links.foreign_loaders.clear()
    links.loader_parameters.clear()
    links.sharded_parameter_calls.clear()
    return convert_text(info.source, options, str(info.path), role, links)


ALREADY_CONVERTED = re.compile(r"^# Distributed (set-up|helpers) added by ddpify", re.MULTILINE)
CALL_NAME = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")


def _route_parameters(project: Project, members: list[ModuleInfo], links: dict, converted: dict) -> list[Path]:
    """Functions that train on a loader parameter (learnt in the first pass) and the group
    modules that call them: each caller gets the calls to look at (``parameter_loaders``);
    returns the callers to convert again. A function no caller feeds is refused (DDP309)."""
    trainers = {
        (project.modules_by_path()[path].name, function): params
        for path, link in links.items()
        for function, params in link.loader_parameters.items()
    }
    if not trainers:
        return []
    callers = []
    for member in members:
        if member.path not in links:
            continue
        calls = {}
        for name in set(CALL_NAME.findall(member.source)):
            found = project.resolve(member, name, classes=True)  # a trainer class's constructor too
            if found is not None and (found[0].name, found[1]) in trainers:
                calls[name] = trainers[(found[0].name, found[1])]
        if calls:
            links[member.path].parameter_loaders = calls
            callers.append(member.path)
    fed = {
        (found[0].name, found[1])
        for path in callers
        for name in links[path].parameter_loaders
        if (found := project.resolve(project.modules_by_path()[path], name, classes=True)) is not None
    }
    for (module, function), _ in trainers.items():
        if (module, function) not in fed:
            path = project.paths[module]
            reason = (
                f"`{function}()` trains on a loader passed to it, and no module of the project that ddpify can "
                "follow calls it: every rank would train on all the data"
            )
            converted[path] = _refusal(converted[path], "DDP309", reason)
    return callers


def _route(project: Project, member: ModuleInfo, foreign, builders: dict, converted: dict, options: ConvertOptions) -> None:
    """A loader ``member`` trains on comes from a function of another module: that module
    shards it. If the function cannot be found, ``member`` is refused (with
    ``--allow-partial``, converted with a warning)."""
    found = project.resolve(member, foreign.function)
    if found is None:
        reason = (
            f"the training loader comes from `{foreign.function}()`, which is not a function of this project "
            "that ddpify can find: every rank would train on all the data"
        )
        result = converted[member.path]
        if options.allow_partial and not result.error:
            warning = Diagnostic(1, 1, "DDP308", f"{reason} (converted anyway: --allow-partial)", Severity.WARNING)
            converted[member.path] = replace(result, diagnostics=(*result.diagnostics, warning))
        else:
            converted[member.path] = _refusal(result, "DDP308", reason)
        return
    module, function = found
    builders.setdefault(module.path, {}).setdefault(function, set()).add(foreign.index)


def _wraps(result: FileResult) -> bool:
    """A refusal, or a conversion that built DistributedDataParallel."""
    return bool(result.error) or (result.changed and "DistributedDataParallel" in result.output)


def _has_side_effects(source: str) -> bool:
    return any(word in source for word in SIDE_EFFECT_WORDS)


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
