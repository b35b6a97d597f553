"""``ddpify check``: flag DataParallel use and DDP hazards, one parse per file.

The rules and their explanations live in ``ddpify/rules.py``. DDP100 and the other forms of
DataParallel (DDP120 functional, DDP121 subclasses and forks, DDP122 variants from other
modules, DDP123 its synchronised BatchNorm) apply to every file; the others only to files that
already use torch.distributed (DDP code), where they are real bugs rather than style: DDP124 is
a DDP path beside DataParallel whose switch plain torchrun leaves unset.

Why ``ast`` and not libcst here: ``check`` only reads, must keep up with ruff on every
commit of a large repository, and needs no byte-exact output. The standard library's
parser is an order of magnitude faster than libcst with scope metadata (docs/performance.md),
and import aliases are resolved by a small table below. ``convert`` keeps libcst, where
formatting must survive and scopes matter.

Speed on large trees (docs/performance.md): a per-rule text pre-filter skips files no rule
can fire in, and within a parsed file only statements whose lines hold a rule word (or an
import alias of a name a rule looks for) are walked. Both are implied by the rules'
conditions; tests/test_check.py holds them to a full walk on torch's own code.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddpify.diagnostics import Diagnostic, Severity
from ddpify.diagnostics import suppressed as _suppressed
from ddpify.names import (
    DATA_LOADER,
    DATA_PARALLEL,
    DATA_PARALLEL_FUNCTION,
    DATA_PARALLEL_METHODS,
    DDP,
    PROGRESS_BARS,
    RANK_WORDS,
    SAMPLER,
    TRACKER_FACTORIES,
    has_word,
)
from ddpify.names import names_data_parallel_variant as _names_data_parallel_variant
from ddpify.names import variant_name as _variant_name
from ddpify.rules import RULES

# Text pre-filter, per file: what the text must contain before any rule can fire there. Each
# test is implied by its rules' conditions (tests/test_check.py checks the torch tree), so
# skipping a file never loses a finding.
FROM_TORCH_IMPORT_DISTRIBUTED = re.compile(r"from\s+torch\s+import\s+(?:\([^)]*|(?:[^\n]|\\\n)*)\bdistributed\b")
CUDA_VISIBLE_DEVICES_SET = re.compile(
    r"""environ\s*\[\s*['"]CUDA_VISIBLE_DEVICES['"]\s*\]\s*=(?!=)|setdefault\s*\(\s*['"]CUDA_VISIBLE_DEVICES"""
)
SHUFFLE_TRUE = re.compile(r"shuffle\s*=\s*True")
# Each starts with a literal, which the regular expression engine finds fast; one pattern of
# alternatives would be tried at every position.
DDP_CODE_HAZARDS = tuple(
    re.compile(pattern)
    for pattern in (r"print\s*\(", r"save\s*\(", r"cuda:\d", r"cuda\s*\(\s*\d", "device_ids", "DistributedSampler",
                    r"print\s+as\b", r"save\s+as\b", "tqdm", "SummaryWriter", "wandb", "--gpu")
)
# Per line: a finding's statement holds one of these words (or an import alias of a name the
# rules look for); statements that do not are not walked, which is most of a large file.
HAZARD_WORDS = ("DataParallel", "CUDA_VISIBLE_DEVICES", "cuda", "print", "save", "Sampler", "set_epoch", "shuffle",
                "device_ids", "tqdm", "trange", "SummaryWriter", "init(", "data_parallel", "replication_callback",
                "SynchronizedBatchNorm", "stdout", "--local", "--launcher", "--multiprocessing", "--distributed", "--gpu")
DISTRIBUTED_WORDS = ("distributed", "DistributedDataParallel")  # references that make a file DDP code
ALIASED = DATA_PARALLEL | DATA_PARALLEL_FUNCTION | DDP | SAMPLER | PROGRESS_BARS | TRACKER_FACTORIES | {"torch.save"}
# DataParallel-only synchronised BatchNorm (Synchronized-BatchNorm-PyTorch), by the name's last part.
SYNC_BN_HELPERS = ("patch_replication_callback", "DataParallelWithCallback")
SYNC_BN_LAYER = "SynchronizedBatchNorm"
# Command-line switches of a DDP path beside DataParallel that plain torchrun does not set.
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
SPAWN_FLAGS = ("--multiprocessing-distributed", "--multiprocessing_distributed")
GPU_FLAGS = ("--gpu", "--gpu-id", "--gpu_id")
LOCAL_RANK_READ = re.compile(r"""['"]LOCAL_RANK['"]""")  # the environment variable, read as a string key
CUDA_INDEX = re.compile(r"cuda:\d+")


@dataclass(frozen=True)
class CheckOptions:
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def wants(self, code: str) -> bool:
        if self.select and not code.startswith(tuple(self.select)):
            return False
        return not code.startswith(tuple(self.ignore)) if self.ignore else True


BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
NESTED = (ast.stmt, ast.excepthandler, ast.match_case)


def _statements(body: list[ast.stmt], lines: list[int] | None = None):
    """Statements, nested ones too, without descending into expressions. With `lines` (sorted
    line numbers), only those whose span holds one: a block that does not is skipped whole."""
    stack = list(body)
    while stack:
        statement = stack.pop()
        if lines is not None and not _touches(statement, lines):
            continue
        yield statement
        for field in BLOCKS:
            stack.extend(getattr(statement, field, ()))


def _is_compound(node: ast.AST) -> bool:
    return any(hasattr(node, field) for field in BLOCKS)


def _touches(node: ast.AST, lines: list[int], last: int | None = None) -> bool:
    """Whether a line in `lines` falls in the node's span (decorators included), or up to `last`."""
    first = getattr(node, "lineno", None)
    if first is None:  # match_case has no position of its own
        return True
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        first = min(first, decorators[0].lineno)
    index = bisect.bisect_left(lines, first)
    return index < len(lines) and lines[index] <= (last or node.end_lineno or node.lineno)


def _header_end(statement: ast.AST) -> int | None:
    """The line where a compound statement's first nested block begins (its header ends there)."""
    nested = next(child for field in BLOCKS for child in getattr(statement, field, ()))
    position = nested if hasattr(nested, "lineno") else getattr(nested, "pattern", None)
    return getattr(position, "lineno", None)


def _lines_with(source: str, words: Iterable[str]) -> list[int]:
    """Sorted line numbers (as ast counts them) of lines containing any of the words."""
    if "\r" in source:  # the parser also ends lines at \r\n and a lone \r
        source = source.replace("\r\n", "\n").replace("\r", "\n")
    offsets = []
    for word in words:  # str.find beats one regular expression of alternatives several times
        offset = source.find(word)
        while offset != -1:
            offsets.append(offset)
            offset = source.find(word, offset + len(word))
    lines: list[int] = []
    line, counted = 1, 0
    for offset in sorted(offsets):
        line += source.count("\n", counted, offset)
        counted = offset
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _import_table(tree: ast.Module, lines: list[int] | None = None) -> dict[str, str]:
    """Local name -> qualified name, from every import in the file (on `lines`, when given)."""
    table: dict[str, str] = {}
    for node in _statements(tree.body, lines):
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
    if "*" in table:  # `from models import *` commonly brings torch and nn along (as convert assumes)
        table.setdefault("torch", "torch")
        table.setdefault("nn", "torch.nn")
    return table


class Checker:
    """Flat passes over the statements on given lines; findings are deduplicated by the caller."""

    def __init__(self, imports: dict[str, str], source_lines: list[str] | None = None) -> None:
        self.imports = imports
        self.source_lines = source_lines or []  # (a reference marked `# ddpify: ignore[DDP100]` is deliberate)
        self.findings: list[tuple[ast.AST, str, bool]] = []  # (node, code, only in DDP code)
        # DDP code: the file imports torch.distributed or DDP, or names them (found by run()).
        self.uses_distributed = any(t.startswith("torch.distributed") or t in DDP for t in imports.values())
        self.samplers: list[ast.Call] = []
        self.calls_set_epoch = False
        # stdout (or print) replaced on the ranks other than 0 at set-up, as DETR's
        # setup_for_distributed and ddpify's ddp_quiet do: prints and bars need no guard
        self.quiets_output = False
        self.guarded: list[tuple[int, int]] = []  # bodies of `if <rank test>:` seen so far
        self.guarded_nodes: set[int] = set()  # inside `x if <rank test> else y`
        self.inner_references: set[int] = set()  # `nn` inside `nn.DataParallel`: already qualified
        self.uses_data_parallel = False  # torch's DataParallel is named (a DP+DDP script, DDP124)
        self.subclass_bases: set[int] = set()  # `nn.DataParallel` in `class X(nn.DataParallel):`
        self.local_variants: set[str] = set()  # classes and functions defined here named *DataParallel*
        self.variant_calls: list[tuple[ast.Call, str]] = []  # `BalancedDataParallel(0, model)`, unless defined here
        self.sync_bn_layers: list[ast.AST] = []  # mentions of SynchronizedBatchNorm*: the first is reported
        self.switches: list[tuple[ast.Call, str]] = []  # add_argument of a DDP-path switch torchrun leaves unset

    def run(self, tree: ast.Module, lines: list[int] | None = None) -> None:
        """Visit the expressions of statements on `lines` (sorted; None: every statement)."""
        for statement in _statements(tree.body, lines):
            if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self._definition(statement)
            if isinstance(statement, ast.If) and _mentions_rank(statement.test):
                # An enclosing `if` comes out of _statements before what it holds.
                self.guarded.append((statement.body[0].lineno, statement.end_lineno or statement.lineno))
            if not _is_compound(statement):
                self._visit_all(statement)
            elif lines is None or _touches(statement, lines, last=_header_end(statement)):
                for child in ast.iter_child_nodes(statement):  # headers: tests, iterables, decorators
                    if not isinstance(child, NESTED):
                        self._visit_all(child)

    def _visit_all(self, root: ast.AST) -> None:
        for node in ast.walk(root):
            kind = type(node)
            if kind is ast.Call:
                self.visit_Call(node)
            elif kind is ast.Attribute or kind is ast.Name:
                if (node.id if kind is ast.Name else node.attr).startswith(SYNC_BN_LAYER):
                    self.sync_bn_layers.append(node)
                self._reference(node)
            elif kind is ast.alias and node.name.rsplit(".", 1)[-1].startswith(SYNC_BN_LAYER):
                self.sync_bn_layers.append(node)
            elif kind is ast.Constant:
                self.visit_Constant(node)
            elif kind is ast.Assign:
                self.visit_Assign(node)
            elif kind is ast.IfExp and _mentions_rank(node.test):  # `SummaryWriter() if rank == 0 else None`
                self.guarded_nodes.update(id(inner) for inner in ast.walk(node.body))

    def is_guarded(self, node: ast.AST) -> bool:
        return id(node) in self.guarded_nodes or any(start <= node.lineno <= end for start, end in self.guarded)

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
            line = self.source_lines[node.lineno - 1] if 0 < node.lineno <= len(self.source_lines) else ""
            # (ddpify's own ddp_alone names it on purpose: not a DataParallel path beside DDP)
            self.uses_data_parallel |= not _suppressed(line, "DDP100")
            self.flag(node, "DDP121" if id(node) in self.subclass_bases else "DDP100", ddp_only=False)

    def _definition(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A class or function named *DataParallel* (its calls are not a foreign variant), a
        subclass of DataParallel (DDP121 at its base), or a fork of it (DDP121 at the class)."""
        if _variant_name(node.name):
            self.local_variants.add(node.name)
        if not isinstance(node, ast.ClassDef):
            return
        self.subclass_bases.update(id(base) for base in node.bases)
        methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if _variant_name(node.name) and methods & DATA_PARALLEL_METHODS:
            if not any(self.qualify(base) in DATA_PARALLEL for base in node.bases):  # else flagged at the base
                self.flag(node, "DDP121", ddp_only=False)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualify(node.func)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch":
            self.calls_set_epoch = True
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            self._check_argument(node)
        last = (name or _dotted(func) or "").rsplit(".", 1)[-1]
        if name in DATA_PARALLEL_FUNCTION:
            self.flag(node, "DDP120", ddp_only=False)
        elif last in SYNC_BN_HELPERS:
            self.flag(node, "DDP123", ddp_only=False)
        elif _variant_name(last) and node.args and name not in DATA_PARALLEL and not (name or "").startswith("torch."):
            self.variant_calls.append((node, last))
        if name in SAMPLER and not _shuffle_off(node):  # set_epoch only changes a shuffled order
            self.samplers.append(node)
        elif name in DATA_LOADER:
            self._check_loader(node)
        elif name == "torch.save" and not self.is_guarded(node):
            self.flag(node, "DDP610")
        elif name == "builtins.print" and not self.is_guarded(node):
            self.flag(node, "DDP611")
        elif name in PROGRESS_BARS and not self.is_guarded(node) and all(k.arg not in ("disable", None) for k in node.keywords):
            self.flag(node, "DDP612")
        elif name in TRACKER_FACTORIES and not self.is_guarded(node):
            self.flag(node, "DDP613")
        elif name in DDP:
            self._check_device_ids(node)
        elif name == "os.environ.setdefault" and node.args and _string(node.args[0]) == "CUDA_VISIBLE_DEVICES":
            self.flag(node.args[0], "DDP711", ddp_only=False)
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and len(node.args) == 1 and not node.keywords:
            if isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
                self.flag(node, "DDP710")

    def _check_argument(self, call: ast.Call) -> None:
        """``parser.add_argument(...)`` of a switch between a DDP path and DataParallel that
        torchrun leaves at its default (DDP124), or of a GPU index with a default (DDP710)."""
        flags = {_string(arg) for arg in call.args}
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        default = keywords.get("default")
        if flags & set(LOCAL_RANK_FLAGS):
            self.switches.append((call, "local_rank"))
        elif "--launcher" in flags:  # mmcv/BasicSR: `--launcher pytorch` selects the DDP path
            self.switches.append((call, "launcher" if _string(default) != "pytorch" else "launcher set"))
        elif flags & set(SPAWN_FLAGS) or ("--distributed" in flags and _string(keywords.get("action")) == "store_true"):
            self.switches.append((call, "flag"))
        elif flags & set(GPU_FLAGS) and isinstance(default, ast.Constant) and type(default.value) is int:
            self.flag(default, "DDP710")

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
            if _dotted(target) in QUIETING_TARGETS:
                self.quiets_output = True
            if isinstance(target, ast.Subscript) and self.qualify(target.value) == "os.environ":
                if _string(target.slice) == "CUDA_VISIBLE_DEVICES":
                    self.flag(target.slice, "DDP711", ddp_only=False)


# Assignments that silence a rank's output, and the findings they make moot.
QUIETING_TARGETS = {"sys.stdout", "builtins.print", "__builtin__.print", "__builtins__.print"}
OUTPUT_CODES = {"DDP611", "DDP612"}


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def _mentions_rank(test: ast.AST) -> bool:
    for node in ast.walk(test):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if any(w in word for w in RANK_WORDS):
            return True
    return False


def could_have_findings(source: str) -> bool:
    if _names_data_parallel_variant(source):  # DDP100, DDP121, DDP122, DDP124 (not DDP or FSDP)
        return True
    if has_word(source, "data_parallel") or has_word(source, "parallel_apply"):  # DDP120 (not fully_sharded_data_parallel)
        return True
    if "replication_callback" in source or SYNC_BN_LAYER in source:  # DDP123
        return True
    if "CUDA_VISIBLE_DEVICES" in source and CUDA_VISIBLE_DEVICES_SET.search(source):  # DDP711
        return True
    if "sampler" in source and SHUFFLE_TRUE.search(source):  # DDP310
        return True
    return _may_use_distributed(source) and any(p.search(source) for p in DDP_CODE_HAZARDS)  # DDP5xx-7xx


def _may_use_distributed(source: str) -> bool:
    """Whether a name could resolve to torch.distributed or DDP (`Checker.uses_distributed`)."""
    if "DistributedDataParallel" in source or ".distributed" in source:
        return True
    return "distributed" in source and FROM_TORCH_IMPORT_DISTRIBUTED.search(source) is not None


def _shuffle_off(call: ast.Call) -> bool:
    return any(
        keyword.arg == "shuffle" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False
        for keyword in call.keywords
    )


def _aliases(imports: dict[str, str]) -> set[str]:
    """Local names bound straight to a name the rules look for (`DP` in `... import X as DP`)."""
    return {
        name for name, target in imports.items()
        if target in ALIASED or _variant_name(last := target.rsplit(".", 1)[-1]) or last in SYNC_BN_HELPERS
    }


def check_source(source: str, options: CheckOptions = CheckOptions()) -> tuple[Diagnostic, ...]:
    """Findings for one file's text, suppressions applied, sorted by position."""
    if not could_have_findings(source):
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        line, col = getattr(error, "lineno", 1) or 1, getattr(error, "offset", 1) or 1
        return (Diagnostic(line, col, "DDP001", f"cannot parse: {getattr(error, 'msg', error)}", Severity.ERROR),)
    return _diagnostics(_checked(tree, source), source, options)


def _checked(tree: ast.Module, source: str, selective: bool = True) -> Checker:
    """The checker after its passes: over the statements holding rule words, or (not
    `selective`, what tests compare against) over every statement."""
    imports = _import_table(tree, _lines_with(source, ["import"]) if selective else None)
    checker = Checker(imports, source.splitlines())
    if not selective:
        checker.run(tree)
    else:
        if not checker.uses_distributed:  # `torch.distributed.…` through `import torch`
            checker.run(tree, _lines_with(source, DISTRIBUTED_WORDS))
        checker.run(tree, _lines_with(source, HAZARD_WORDS + tuple(_aliases(imports))))
    # A module ddpify converted in a project: the loader it builds gets set_epoch where
    # another module iterates it (DDP501 there).
    if not checker.calls_set_epoch and "# Distributed helpers added by ddpify" not in source:
        for sampler in checker.samplers:
            checker.flag(sampler, "DDP510")
    for call, name in checker.variant_calls:
        if name not in checker.local_variants:
            checker.flag(call, "DDP122", ddp_only=False)
    # Once a file (a model has many such layers), unless it converts them to torch's SyncBatchNorm.
    if checker.sync_bn_layers and "convert_sync_batchnorm" not in source:
        checker.flag(min(checker.sync_bn_layers, key=lambda n: (n.lineno, n.col_offset)), "DDP123", ddp_only=False)
    if checker.uses_data_parallel:
        # With a --launcher switch, that one selects the DDP path (a --local_rank beside it is
        # only the old launcher's argument); torchrun's "LOCAL_RANK" read anywhere is taken as the fix.
        kinds = {kind for _, kind in checker.switches}
        for call, kind in checker.switches:
            if kind == "launcher set" or kind == "local_rank" and (
                kinds & {"launcher", "launcher set"} or LOCAL_RANK_READ.search(source)
            ):
                continue
            checker.flag(call, "DDP124")
    return checker


def _diagnostics(checker: Checker, source: str, options: CheckOptions) -> tuple[Diagnostic, ...]:
    """The checker's findings as diagnostics: DDP-code rules only in DDP code, suppressions applied."""
    lines = source.splitlines()
    found = set()
    for node, code, ddp_only in checker.findings:
        if (ddp_only and not checker.uses_distributed) or not options.wants(code):
            continue
        if code in OUTPUT_CODES and checker.quiets_output:
            continue
        text = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
        # ast columns count UTF-8 bytes; report characters, 1-based.
        col = len(text.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")) + 1
        if not _suppressed(text, code):
            found.add(Diagnostic(node.lineno, col, code, RULES[code].summary, Severity.WARNING))
    return tuple(sorted(found))
