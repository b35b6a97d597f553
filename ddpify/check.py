"""``ddpify check``: flag DataParallel use and DDP hazards, one parse per file.

The rules and their explanations live in ``ddpify/rules.py``. DDP100 applies to every file;
the others only to files that already use torch.distributed (DDP code), where they are
real bugs rather than style.

Why ``ast`` and not libcst here: ``check`` only reads, must keep up with ruff on every
commit of a large repository, and needs no byte-exact output. The standard library's
parser is an order of magnitude faster than libcst with scope metadata (docs/performance.md),
and import aliases are resolved by a small table below. ``convert`` keeps libcst, where
formatting must survive and scopes matter.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddpify.diagnostics import Diagnostic, Severity
from ddpify.names import DATA_LOADER, DATA_PARALLEL, DDP, RANK_WORDS, SAMPLER
from ddpify.rules import RULES

# Text pre-filter: the words each rule needs in the file before it can fire.
ANY_FILE = ("DataParallel", "CUDA_VISIBLE_DEVICES")  # DDP100, DDP711 (and DDP code using DDP)
DDP_CODE = ("print", "save", "cuda", "DistributedSampler")  # DDP5xx-7xx, in torch.distributed code
CUDA_INDEX = re.compile(r"cuda:\d+")
SUPPRESSION = re.compile(r"#\s*(?:noqa|ddpify:\s*ignore)(?::\s*|\[)?([A-Z0-9, ]*)\]?", re.IGNORECASE)


@dataclass(frozen=True)
class CheckOptions:
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def wants(self, code: str) -> bool:
        if self.select and not code.startswith(tuple(self.select)):
            return False
        return not code.startswith(tuple(self.ignore)) if self.ignore else True


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones too, without descending into expressions (cheap)."""
    stack = list(body)
    while stack:
        statement = stack.pop()
        yield statement
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(getattr(statement, field, ()))


def _import_table(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name, from every import in the file."""
    table: dict[str, str] = {}
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    table[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    table[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                table[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return table


class Checker:
    """One flat pass over the tree; rank-0 guards are line ranges found beforehand."""

    def __init__(self, imports: dict[str, str], tree: ast.Module) -> None:
        self.imports = imports
        self.findings: list[tuple[ast.AST, str, bool]] = []  # (node, code, only in DDP code)
        self.uses_distributed = False
        self.samplers: list[ast.Call] = []
        self.calls_set_epoch = False
        self.guarded = [
            (node.body[0].lineno, node.end_lineno or node.lineno)
            for node in _statements(tree.body)
            if isinstance(node, ast.If) and _mentions_rank(node.test)
        ]
        self.inner_references: set[int] = set()  # `nn` inside `nn.DataParallel`: already qualified

    def run(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            kind = type(node)
            if kind is ast.Call:
                self.visit_Call(node)
            elif kind is ast.Attribute or kind is ast.Name:
                self._reference(node)
            elif kind is ast.Constant:
                self.visit_Constant(node)
            elif kind is ast.Assign:
                self.visit_Assign(node)

    def is_guarded(self, node: ast.AST) -> bool:
        return any(start <= node.lineno <= end for start, end in self.guarded)

    def qualify(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, f"builtins.{node.id}" if node.id == "print" else None)
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def flag(self, node: ast.AST, code: str, ddp_only: bool = True) -> None:
        self.findings.append((node, code, ddp_only))

    def _reference(self, node: ast.Attribute | ast.Name) -> None:
        if id(node) in self.inner_references:
            return
        name = self.qualify(node)
        if name is None:
            return
        if isinstance(node, ast.Attribute):
            inner = node.value
            while isinstance(inner, ast.Attribute):  # judged here, as part of the longer name
                self.inner_references.add(id(inner))
                inner = inner.value
            self.inner_references.add(id(inner))
        if name.startswith("torch.distributed") or name in DDP:
            self.uses_distributed = True
        if name in DATA_PARALLEL:
            self.flag(node, "DDP100", ddp_only=False)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualify(node.func)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch":
            self.calls_set_epoch = True
        if name in SAMPLER:
            self.samplers.append(node)
        elif name in DATA_LOADER:
            self._check_loader(node)
        elif name == "torch.save" and not self.is_guarded(node):
            self.flag(node, "DDP610")
        elif name == "builtins.print" and not self.is_guarded(node):
            self.flag(node, "DDP611")
        elif name in DDP:
            self._check_device_ids(node)
        elif name == "os.environ.setdefault" and node.args and _string(node.args[0]) == "CUDA_VISIBLE_DEVICES":
            self.flag(node.args[0], "DDP711", ddp_only=False)
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and len(node.args) == 1 and not node.keywords:
            if isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
                self.flag(node, "DDP710")

    def _check_loader(self, call: ast.Call) -> None:
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        shuffle = keywords.get("shuffle")
        if "sampler" in keywords and isinstance(shuffle, ast.Constant) and shuffle.value is True:
            self.flag(call, "DDP310", ddp_only=False)

    def _check_device_ids(self, call: ast.Call) -> None:
        for keyword in call.keywords:
            if keyword.arg == "device_ids" and isinstance(keyword.value, ast.List):
                if any(isinstance(e, ast.Constant) and type(e.value) is int for e in keyword.value.elts):
                    self.flag(keyword, "DDP710")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and CUDA_INDEX.fullmatch(node.value):
            self.flag(node, "DDP710")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Subscript) and self.qualify(target.value) == "os.environ":
                if _string(target.slice) == "CUDA_VISIBLE_DEVICES":
                    self.flag(target.slice, "DDP711", ddp_only=False)


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _mentions_rank(test: ast.AST) -> bool:
    for node in ast.walk(test):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if any(w in word for w in RANK_WORDS):
            return True
    return False


def could_have_findings(source: str) -> bool:
    if any(word in source for word in ANY_FILE):
        return True
    if "sampler" in source and "shuffle" in source:  # DDP310
        return True
    return "distributed" in source and any(word in source for word in DDP_CODE)


def check_source(source: str, options: CheckOptions = CheckOptions()) -> tuple[Diagnostic, ...]:
    """Findings for one file's text, suppressions applied, sorted by position."""
    if not could_have_findings(source):
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        line, col = getattr(error, "lineno", 1) or 1, getattr(error, "offset", 1) or 1
        return (Diagnostic(line, col, "DDP001", f"cannot parse: {getattr(error, 'msg', error)}", Severity.ERROR),)
    checker = Checker(_import_table(tree), tree)
    checker.run(tree)
    if not checker.calls_set_epoch:
        for sampler in checker.samplers:
            checker.flag(sampler, "DDP510")
    lines = source.splitlines()
    found = set()
    for node, code, ddp_only in checker.findings:
        if (ddp_only and not checker.uses_distributed) or not options.wants(code):
            continue
        text = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
        # ast columns count UTF-8 bytes; report characters, 1-based.
        col = len(text.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")) + 1
        if not _suppressed(text, code):
            found.add(Diagnostic(node.lineno, col, code, RULES[code].summary, Severity.WARNING))
    return tuple(sorted(found))


def _suppressed(line: str, code: str) -> bool:
    """`# noqa`, `# noqa: DDP611`, `# ddpify: ignore[DDP611]` (codes by prefix) on the line."""
    match = SUPPRESSION.search(line)
    if match is None:
        return False
    codes = [c.strip() for c in match.group(1).split(",") if c.strip()]
    return not codes or any(code.startswith(c) for c in codes)
