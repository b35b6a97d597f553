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

# Text pre-filter: a file mentioning none of these cannot have a finding.
MARKERS = ("DataParallel", "distributed", "CUDA_VISIBLE_DEVICES")
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


def _import_table(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name, from every import in the file."""
    table: dict[str, str] = {}
    for node in ast.walk(tree):
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


class Checker(ast.NodeVisitor):
    def __init__(self, imports: dict[str, str]) -> None:
        self.imports = imports
        self.findings: list[tuple[ast.AST, str, bool]] = []  # (node, code, only in DDP code)
        self.uses_distributed = False
        self.samplers: list[ast.Call] = []
        self.calls_set_epoch = False
        self.rank_guards = 0

    def qualify(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, f"builtins.{node.id}" if node.id == "print" else None)
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def flag(self, node: ast.AST, code: str, ddp_only: bool = True) -> None:
        self.findings.append((node, code, ddp_only))

    # -- references ------------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not self._reference(node):
            self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._reference(node)

    def _reference(self, node: ast.Attribute | ast.Name) -> bool:
        name = self.qualify(node)
        if name is None:
            return False
        if name.startswith("torch.distributed") or name in DDP:
            self.uses_distributed = True
        if name in DATA_PARALLEL:
            self.flag(node, "DDP100", ddp_only=False)
        return True

    # -- rank-0 guards -----------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        guard = _mentions_rank(node.test)
        self.rank_guards += guard
        for child in [*node.body, *node.orelse]:
            self.visit(child)
        self.rank_guards -= guard

    # -- calls -----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualify(node.func)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch":
            self.calls_set_epoch = True
        if name in SAMPLER:
            self.samplers.append(node)
        elif name in DATA_LOADER:
            self._check_loader(node)
        elif name == "torch.save" and not self.rank_guards:
            self.flag(node, "DDP610")
        elif name == "builtins.print" and not self.rank_guards:
            self.flag(node, "DDP611")
        elif name in DDP:
            self._check_device_ids(node)
        elif name == "os.environ.setdefault" and node.args and _string(node.args[0]) == "CUDA_VISIBLE_DEVICES":
            self.flag(node.args[0], "DDP711", ddp_only=False)
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and len(node.args) == 1 and not node.keywords:
            if isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
                self.flag(node, "DDP710")
        self.generic_visit(node)

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

    # -- strings and environment -----------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and CUDA_INDEX.fullmatch(node.value):
            self.flag(node, "DDP710")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Subscript) and self.qualify(target.value) == "os.environ":
                if _string(target.slice) == "CUDA_VISIBLE_DEVICES":
                    self.flag(target.slice, "DDP711", ddp_only=False)
        self.generic_visit(node)


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _mentions_rank(test: ast.AST) -> bool:
    for node in ast.walk(test):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if any(w in word for w in RANK_WORDS):
            return True
    return False


def check_source(source: str, options: CheckOptions = CheckOptions()) -> tuple[Diagnostic, ...]:
    """Findings for one file's text, suppressions applied, sorted by position."""
    if not any(marker in source for marker in MARKERS):
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        line, col = getattr(error, "lineno", 1) or 1, getattr(error, "offset", 1) or 1
        return (Diagnostic(line, col, "DDP001", f"cannot parse: {getattr(error, 'msg', error)}", Severity.ERROR),)
    checker = Checker(_import_table(tree))
    checker.visit(tree)
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
