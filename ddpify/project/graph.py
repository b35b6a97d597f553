"""What a project is: its modules, who imports whom, and what each module's text shows
(``ModuleInfo``: a ``__main__`` block, DataParallel, a training step, its functions).

The import graph comes from :mod:`ast` (fast, no libcst), parsed lazily: scripts and
DataParallel modules first, then what they import. Conversion is ``groups.py``'s.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ddpify.names import STAR_NAME, mentions_data_parallel
from ddpify.project.neighbours import parse_source

# A library module is worth converting when its functions print, save or write files, or
# pick a GPU by index (every rank would use that one).
TOP_LEVEL_LOOP = re.compile(r"^(?:for|while|if|with|try)\b", re.MULTILINE)  # maybe a flat script (see _loops_at_top_level)
TOP_LEVEL_RUN = re.compile(r"^[A-Za-z_]\w*\.(?:\w*[Tt]rain\w*|fit|run|main|start)\s*\(", re.MULTILINE)  # see _runs_an_object
BACKWARD = re.compile(r"\.backward\s*\(")
TRAINING_STEP = re.compile(r"([\w.]*)\.(backward|step)\s*\(")  # not `scheduler.step()`
INSTANCE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*([A-Za-z_][\w.]*)\s*\(", re.MULTILINE)  # `x = Cls(...)`
CALL_NAME = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
SIDE_EFFECT_WORDS = (
    "print(", "torch.save(", ".save(", "open(", "tqdm", "logging", "shutil.", "cuda:", "set_device", ".cuda(",
    "SummaryWriter", "wandb", "mkdir(", "makedirs(", "save_image", "imwrite", "imsave", "savefig", ".write(", "download=",
    "init_process_group(",  # (a start-up helper's own: it must not start a second group, DDP208)
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
    # a `__main__` block read as a self-test: the names it calls (one of a project module's makes
    # it a script after all: optml_gan's run.py calls `run_experiment(...)` of src/gridsearch.py)
    self_test_calls: frozenset[str] = frozenset()
    wraps: bool = False  # says DataParallel
    trains: bool = False  # calls .backward() or .step()
    parses: bool = True  # False: Python cannot read it (a merge-conflict marker, Python 2)
    # `importlib.import_module("models." + name)`: every project module under "models."
    dynamic_prefixes: set[str] = field(default_factory=set)
    star_modules: list[str] = field(default_factory=list)  # `from .util import *`: what it re-exports


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
        tree = parse_source(source)
    except (SyntaxError, ValueError):
        info.parses = False
        return info
    package = info.name.split(".") if path.name == "__init__.py" else info.name.split(".")[:-1]
    # (BicycleGAN's `model_filename = "models." + model_name + "_model"`, then
    # `importlib.import_module(model_filename)`: the name a dynamic import is given)
    strings = {
        target.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name) and isinstance(node.value, (ast.BinOp, ast.JoinedStr))
    }
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
                if alias.name == "*":
                    info.star_modules.append(module)
                    continue
                info.bindings[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.If) and _is_main_test(node.test):
            info.runs = True
        elif isinstance(node, ast.Call) and (prefix := _dynamic_import_prefix(node, strings)) is not None:
            info.dynamic_prefixes.add(prefix)
    # A flat script (no `__main__` block) runs its loops at the top level, or parses its
    # arguments there and hands them to what it imports (hotpot's main.py: `train(config)`).
    # (or wraps a model there and calls on: Cold-Diffusion's `model = DataParallel(...)`, then
    # `trainer = Trainer(model, ...)`, `trainer.train()`)
    # (a `__main__` block that only builds what the module defines, AttGAN's attgan.py smoke
    # test `attgan = AttGAN(args)`, trains nothing: the module is its importers' library)
    defined = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if info.runs and _self_test_only(tree, {node.name for node in defined}):
        info.runs = False
        info.self_test_calls = _main_block_calls(tree)
    info.runs = info.runs or _loops_at_top_level(tree.body) or _runs_imported_code(tree.body, set(info.bindings)) or _runs_an_object(tree.body) or (
        _runs_its_own_training(tree.body, {node.name: node for node in defined})
    ) or (
        _wraps_at_top_level(tree.body) and any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) for node in tree.body)
    )
    segment = _segments(source)
    info.functions = {node.name for node in defined}
    info.function_sources = {node.name: segment(node) for node in defined}
    info.class_sources = {node.name: segment(node) for node in tree.body if isinstance(node, ast.ClassDef)}
    functions_anywhere = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    info.training_defs = {node.name for node in functions_anywhere if _trains(segment(node))}
    info.def_words = {node.name: _words(node) for node in functions_anywhere}
    info.words = _words(tree)
    return info


LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")


def _segments(source: str):
    """``ast.get_source_segment(source, node) or ""`` for the nodes of one file, with the
    file split into lines once (the standard library splits it again on every call)."""
    lines = LINE.findall(source)
    if lines and not lines[-1]:
        lines.pop()

    def segment(node: ast.AST) -> str:
        if node.end_lineno is None or node.end_col_offset is None or node.end_lineno > len(lines):
            return ast.get_source_segment(source, node) or ""
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
        head = lines[first].encode()[node.col_offset :].decode()
        tail = lines[last].encode()[: node.end_col_offset].decode()
        return "".join([head, *lines[first + 1 : last], tail])

    return segment


def _dynamic_import_prefix(call: ast.Call, strings: dict[str, ast.expr] | None = None) -> str | None:
    """``importlib.import_module("models." + name)`` (or an f-string, ``__import__``, or a name
    bound to one of those in ``strings``): the module name's constant start, if it names a
    package ("models.")."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not call.args:
        return None
    name = call.args[0]
    if isinstance(name, ast.Name) and strings and name.id in strings:
        name = strings[name.id]
    while isinstance(name, ast.BinOp) and isinstance(name.op, ast.Add):
        name = name.left
    if isinstance(name, ast.JoinedStr) and name.values:
        name = name.values[0]
    if isinstance(name, ast.Constant) and isinstance(name.value, str) and "." in name.value:
        return name.value[: name.value.rindex(".") + 1]
    if not isinstance(name, ast.Constant):
        # (the speech-enhancement trainer's `importlib.import_module(cfg["module"])`: a name read
        # from a configuration may be any module of the project that trains or wraps)
        return ""
    return None


def _wraps_at_top_level(body: list[ast.stmt]) -> bool:
    """A statement of the module's own body that calls DataParallel."""
    return any(
        isinstance(call, ast.Call) and (ast.unparse(call.func).rpartition(".")[2] == "DataParallel")
        for node in body if isinstance(node, (ast.Assign, ast.Expr))
        for call in ast.walk(node)
    )


def _self_test_only(tree: ast.Module, functions: set[str]) -> bool:
    """The module's `__main__` block runs no loop, no training step and none of the module's
    functions: it builds an object of a class defined here and looks at it. (Not one that
    calls a method of a class here that loops, or is named for training: ssds.pytorch's
    `Solver().train_model()`, whose loop calls the project's train_epoch())"""
    blocks = [node for node in tree.body if isinstance(node, ast.If) and _is_main_test(node.test)]
    if len(blocks) != 1:
        return False
    block = blocks[0]
    if any(isinstance(node, (ast.For, ast.While)) for node in ast.walk(block)):
        return False
    calls = [node for node in ast.walk(block) if isinstance(node, ast.Call)]
    named = {ast.unparse(call.func).rpartition(".")[2] for call in calls} | {ast.unparse(call.func) for call in calls}
    # (a function handed to a command-line dispatcher runs too: pytorchic-bert's `fire.Fire(main)`,
    # `CLI(main)`, `mp.spawn(main_worker, ...)`; `fire.Fire()` runs any of them: batch 45)
    handed = {
        value.id for call in calls for value in [*call.args, *(keyword.value for keyword in call.keywords)]
        if isinstance(value, ast.Name)
    }
    if named & functions or handed & functions or "Fire" in named or any(TRAINING_NAME.search(name) for name in named):
        return False
    looping = {
        method.name for cls in tree.body if isinstance(cls, ast.ClassDef) for method in cls.body
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(method))
    }
    return not named & looping


def _main_block_calls(tree: ast.Module) -> frozenset[str]:
    """The names the ``__main__`` block calls (``run_experiment``, the head of ``pkg.run(...)``)."""
    return frozenset(
        ast.unparse(node.func).split(".")[0] for block in tree.body if isinstance(block, ast.If) and _is_main_test(block.test)
        for node in ast.walk(block) if isinstance(node, ast.Call)
    )


# A called name that says it trains (`train`, `train_model`, `fit`, `run`, `main`, `step`)
TRAINING_NAME = re.compile(r"^(backward|step|run|main)$|train|fit", re.IGNORECASE)


def _runs_imported_code(body: list[ast.stmt], imported: set[str]) -> bool:
    """Arguments parsed at the top level, and a call there (or in a top-level ``if``) of a
    name the module imports: a script without a ``__main__`` block."""
    parses = any(
        isinstance(node, (ast.Assign, ast.Expr)) and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in ("parse_args", "parse_known_args")
        for node in body
    )
    if not parses:
        return False
    statements = [node for top in body if isinstance(top, ast.If) for node in ast.walk(top)] + list(body)
    return any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
        and node.value.func.id in imported
        for node in statements
    )


def _runs_its_own_training(body: list[ast.stmt], defined: dict[str, ast.FunctionDef]) -> bool:
    """A call at the top level (or in a top-level ``if``) of a function of this module that wraps
    or trains: reid's ``main(parser.parse_args())``, left outside the ``__main__`` block that only
    parses the arguments, runs at import as a flat script's code does (single-file mode reads it so)."""
    statements = [node for top in body if isinstance(top, ast.If) for node in ast.walk(top)] + list(body)
    for node in statements:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            function = defined.get(node.value.func.id)
            text = ast.unparse(function) if function is not None else ""
            if function is not None and (mentions_data_parallel(text) or _trains(text)):
                return True
    return False


def _runs_an_object(body: list[ast.stmt]) -> bool:
    """An object built at the top level and run there (torch_npss's flat entries: ``trainer =
    ModelTrainer(model=model, ...)``, then ``trainer.train(batch_size=32, epochs=1650)``): a
    script without a ``__main__`` block, whatever it parses."""
    built = {
        target.id
        for node in body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for target in node.targets if isinstance(target, ast.Name)
    }
    return any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
        and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id in built
        and ("train" in node.value.func.attr.lower() or node.value.func.attr in ("fit", "run", "main", "start"))
        for node in body
    )


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
        self._call_counts: dict[str, int] = {}  # function -> modules that train nothing and call it (shared_builders)

    def in_project(self, module: str) -> bool:
        return module in self.paths or any(other.startswith(module + ".") for other in self.paths)

    def modules_by_path(self) -> dict[Path, ModuleInfo]:
        return {info.path: info for info in self._read.values()}

    def module(self, name: str) -> ModuleInfo:
        if name not in self._read:
            path = self.paths[name]
            info = read_module(self.root, path, self.sources[path])
            self._follow_search_path(info)
            info.imports |= {other for other in self.paths for prefix in info.dynamic_prefixes if prefix and other.startswith(prefix)}
            if "" in info.dynamic_prefixes:
                info.imports |= {other for other, path in self.paths.items() if _trains(self.sources[path]) or mentions_data_parallel(self.sources[path])}
            info.imports = {other for other in info.imports if other in self.paths and other != name}
            # Only names bound from the project's own modules (calls through them may train).
            info.imported_names = {
                bound
                for bound, (module, attribute) in info.bindings.items()
                if self.in_project(module) and (module, attribute) != (name, None)
            }
            if info.self_test_calls & info.imported_names:
                info.runs = True
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
                canonical[module] = f"{places[0]}.{module}" if len(places) == 1 else self._defining(info, module)
        info.imports = {canonical[module] for module in info.imports}
        info.bindings = {
            bound: (canonical.get(module) or self._located(info, module), attribute)
            for bound, (module, attribute) in info.bindings.items()
        }

    def _defining(self, info: ModuleInfo, module: str) -> str:
        """A bare ``from solver import Solver`` that only a folder put on PYTHONPATH by the
        project's shell scripts finds (X-Punctuator's src/solver/solver.py): the one module of the
        project so named that defines every name imported from it; else the name as it is
        (``import logging`` is not utils/logging.py: nothing is imported from it by name)."""
        names = [attribute for bound, (source, attribute) in info.bindings.items() if source == module]
        found = [other for other in self.paths if other.endswith("." + module)]
        if not names or None in names or len(found) != 1:
            return module
        source = self.sources[self.paths[found[0]]]
        defined = all(re.search(rf"^(def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=", source, re.MULTILINE) for name in names)
        return found[0] if defined else module

    def _located(self, info: ModuleInfo, module: str) -> str:
        if not module or self.in_project(module):
            return module
        package = info.name.rpartition(".")[0]
        if package and self.in_project(f"{package}.{module}"):
            return f"{package}.{module}"
        own = self.root.resolve().name + "."
        if module.startswith(own) and self.in_project(module[len(own):]):
            return module[len(own):]  # (the folder is a package its files import by its name, its parent on sys.path)
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
            or TOP_LEVEL_RUN.search(self.sources[path])
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
            module, attribute = self._starred(info, head)
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
            if module is None:  # (`from .util import *` in a package's __init__: pytorch-template's utils)
                module, attribute = self._starred(target, path[0])
            if module not in self.paths or attribute is None:
                return None
            path = [attribute]
        return None

    def _starred(self, info: ModuleInfo, name: str) -> tuple[str | None, str | None]:
        """The project module a star import of ``info`` takes ``name`` from, if one defines or
        binds it (the last such import wins, as at run time)."""
        for module in reversed(info.star_modules):
            if module in self.paths:
                target = self.module(module)
                if name in target.functions or name in target.class_sources or name in target.bindings:
                    return module, name
        return None, None

    def project_names(self, info: ModuleInfo) -> frozenset[str]:
        """Names this module binds from other project modules (calls to them may train);
        not those that only pass a library's name on (`from dataset import DataLoader`)."""
        reexported = {bound for bound in info.imported_names if self.library_name(info, bound)}
        return frozenset(info.imported_names - reexported)

    def training_calls(self, info: ModuleInfo) -> frozenset[str]:
        """Names called here of other modules' top-level functions that run a training step,
        and methods called on an object of another module's class that do (Cold-Diffusion's
        `trainer = Trainer(model, ...)`, then `trainer.train()`)."""
        found = set()
        for name in set(CALL_NAME.findall(info.source)):
            target = self.resolve(info, name)
            if target is not None and target[0] is not info and _trains(target[0].function_sources.get(target[1], "")):
                found.add(name)
        for instance, made in INSTANCE.findall(info.source):
            target = self.resolve(info, made, classes=True)
            if target is None and made not in found:
                # a class picked from a table at run time (AttentionedDeepPaint's `trainer =
                # TRIANER_MAP.get(args.model)`, then `trainer = trainer(args, loader, device)`): a
                # training method of any project class this module imports
                found.update(f"{instance}.{method}" for method in self._imported_training_methods(info) if f"{instance}.{method}(" in info.source)
            if target is None or target[0] is info or made in found:
                continue
            if target[1] in target[0].functions:  # a factory (SRFBN's create_solver returns SRSolver(opt))
                made_there = _class_returned(target[0].function_sources.get(target[1], ""))
                target = self.resolve(target[0], made_there, classes=True) if made_there else None
                if target is None:
                    continue
            methods = _training_method_names(target[0].class_sources.get(target[1], ""))
            found.update(f"{instance}.{method}" for method in methods if f"{instance}.{method}(" in info.source)
            if "__call__" in methods and re.search(rf"(?<![\w.]){re.escape(instance)}\s*\(", info.source):
                found.add(instance)  # (Lipreading-DenseNet3D's `trainer(model, epoch)`: Trainer.__call__ trains)
        return frozenset(found)

    def shared_builders(self, info: ModuleInfo) -> frozenset[str]:
        """Names bound here of project functions that a module of the project which trains
        nothing calls too (loqui's ``helpers.dataset2dataloader``, called for training in
        model_train.py and for validation in model_validation.py): a loader such a function
        returns is sharded where the training draws it, the builder staying whole for the others."""
        found = set()
        for name in set(CALL_NAME.findall(info.source)):
            target = self.resolve(info, name)
            if target is None or target[0] is info:
                continue
            function = target[1]
            if function not in self._call_counts:
                pattern = re.compile(rf"(?<![\w])(?<!def ){re.escape(function)}\s*\(")
                self._call_counts[function] = sum(
                    1 for path, source in self.sources.items()
                    if path != target[0].path and not _trains(source) and pattern.search(source)
                )
            if self._call_counts[function]:
                found.add(name)
        return frozenset(found)

    def _imported_training_methods(self, info: ModuleInfo) -> set[str]:
        """The training methods of the project classes this module imports."""
        methods: set[str] = set()
        for bound in info.imported_names:
            target = self.resolve(info, bound, classes=True)
            if target is not None and target[1] in target[0].class_sources:
                methods |= _training_method_names(target[0].class_sources[target[1]])
        return methods

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
        found.update((STAR_NAME + name, library) for name, library in self._star_libraries(info).items())
        return found

    def _star_libraries(self, info: ModuleInfo, depth: int = 0) -> dict[str, str]:
        """Library names a star import of a project module passes on (Transformer-TTS's
        `from network import *`, network.py's `from module import *`, module.py's `import
        torch as t`: `t` is torch): name -> the library's dotted name."""
        found: dict[str, str] = {}
        for module in info.star_modules:
            if module not in self.paths or module == info.name or depth > 3:
                continue
            target = self.module(module)
            found.update(self._star_libraries(target, depth + 1))
            for bound, (source, attribute) in target.bindings.items():
                if not self.in_project(source):
                    found[bound] = f"{source}.{attribute}" if attribute else source
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


def _class_returned(function_source: str) -> str | None:
    """The class a factory function returns an instance of: ``return Cls(...)``, or a name
    bound to one (``solver = SRSolver(opt)`` ... ``return solver``)."""
    try:
        tree = ast.parse(textwrap.dedent(function_source))
    except SyntaxError:
        return None
    made = {
        target.id: ast.unparse(node.value.func) for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for target in node.targets if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            return ast.unparse(node.value.func)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id in made:
            return made[node.value.id]
    return None


def _training_method_names(class_source: str) -> set[str]:
    """Methods of a class that run a training step on data of their own (an attribute such as
    ``self.dl``), themselves or through another method. One that iterates a loader it is given
    (CenterNet's ``trainer.train(epoch, loader)``) is routed as a loader parameter instead."""
    try:
        tree = ast.parse(textwrap.dedent(class_source))
    except SyntaxError:
        return set()
    cls = next((node for node in tree.body if isinstance(node, ast.ClassDef)), None)
    if cls is None:
        return set()
    defs = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = {name: ast.unparse(m) for name, m in defs.items()}
    training = {name for name, text in methods.items() if _trains(text)}
    grown = True
    while grown:
        more = {name for name, text in methods.items() if name not in training and any(f"self.{t}(" in text for t in training)}
        training |= more
        grown = bool(more)
    # (an evaluation that iterates the data it is given, AttentionedDeepPaint's validate(self,
    # dataset, ...), routes nothing: only a training method's loader parameter does)
    if any(_iterates_a_parameter(defs[name]) for name in training):
        return set()
    return training


def _iterates_a_parameter(method: ast.FunctionDef) -> bool:
    """``for x, y in loader:`` (or through enumerate/tqdm) over one of the method's parameters."""
    params = {a.arg for a in method.args.args[1:]}
    return any(isinstance(node, ast.For) and _iterated(node.iter) & params for node in ast.walk(method))


def _iterated(iterable: ast.expr) -> set[str]:
    """The names a loop draws from, through enumerate/zip/tqdm/iter (not enumerate's start,
    AttentionedDeepPaint's ``enumerate(self.data_loader, last_iteration)``)."""
    if isinstance(iterable, ast.Name):
        return {iterable.id}
    if isinstance(iterable, ast.Call):
        called = ast.unparse(iterable.func).rpartition(".")[2]
        if called in ("enumerate", "iter", "tqdm", "trange", "list", "sorted", "reversed") and iterable.args:
            return _iterated(iterable.args[0])
        if called == "zip":
            return {name for arg in iterable.args for name in _iterated(arg)}
        return {n.id for n in ast.walk(iterable) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(iterable) if isinstance(n, ast.Name)}
