"""``ddpify check``: flag DataParallel use and DDP hazards, one parse per file.

The rules and their explanations live in ``ddpify/rules.py``. DDP100 applies to every file;
the others only to files that already use torch.distributed (DDP code), where they are
real bugs rather than style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider

from ddpify.analysis import DATA_LOADER, DATA_PARALLEL, under_rank_guard
from ddpify.diagnostics import Diagnostic, Severity
from ddpify.rules import RULES

# Text pre-filter: a file mentioning none of these cannot have a finding.
MARKERS = ("DataParallel", "distributed", "CUDA_VISIBLE_DEVICES")
SAMPLER = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
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


class Checker(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ParentNodeProvider)

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.module = module
        self.findings: list[tuple[cst.CSTNode, str, bool]] = []  # (node, code, only in DDP code)
        self.uses_distributed = False
        self.samplers: list[cst.Call] = []
        self.calls_set_epoch = False

    def names(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def flag(self, node: cst.CSTNode, code: str, ddp_only: bool = True) -> None:
        self.findings.append((node, code, ddp_only))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Attribute | cst.Name) -> None:
        names = self.names(node)
        if any(name.startswith("torch.distributed") for name in names) or names & DDP:
            self.uses_distributed = True
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if names & DATA_PARALLEL and not isinstance(parent, (cst.Attribute, cst.ImportAlias)):
            self.flag(node, "DDP100", ddp_only=False)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.names(node.func)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "set_epoch":
            self.calls_set_epoch = True
        if names & SAMPLER:
            self.samplers.append(node)
        if names & DATA_LOADER:
            self._check_loader(node)
        if names & {"torch.save"} and not self._guarded(node):
            self.flag(node, "DDP610")
        if names & {"builtins.print"} and not self._guarded(node):
            self.flag(node, "DDP611")
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            if len(node.args) == 1 and isinstance(node.args[0].value, cst.Integer):
                self.flag(node, "DDP710")
        if names & DDP:
            for arg in node.args:
                if arg.keyword and arg.keyword.value == "device_ids" and isinstance(arg.value, cst.List):
                    if any(isinstance(element.value, cst.Integer) for element in arg.value.elements):
                        self.flag(arg, "DDP710")

    def _check_loader(self, call: cst.Call) -> None:
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword}
        shuffle = keywords.get("shuffle")
        if "sampler" in keywords and isinstance(shuffle, cst.Name) and shuffle.value == "True":
            self.flag(call, "DDP310", ddp_only=False)

    def _guarded(self, node: cst.CSTNode) -> bool:
        return under_rank_guard(
            node, lambda n: self.get_metadata(ParentNodeProvider, n, None), self.module.code_for_node
        )

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str):
            if CUDA_INDEX.fullmatch(value):
                self.flag(node, "DDP710")
            elif value == "CUDA_VISIBLE_DEVICES" and self._sets_environment(node):
                self.flag(node, "DDP711", ddp_only=False)

    def _sets_environment(self, node: cst.SimpleString) -> bool:
        """`os.environ["CUDA_VISIBLE_DEVICES"] = ...` or `os.environ.setdefault("CUDA_...", ...)`."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None and not isinstance(parent, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.Assign):
            return any("os.environ" in self.names(t.target.value) for t in parent.targets if isinstance(t.target, cst.Subscript))
        if isinstance(parent, cst.Expr) and isinstance(parent.value, cst.Call):
            func = parent.value.func
            return isinstance(func, cst.Attribute) and func.attr.value in ("setdefault", "update", "__setitem__")
        return False

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.calls_set_epoch:
            for sampler in self.samplers:
                self.flag(sampler, "DDP510")


def check_source(source: str, options: CheckOptions = CheckOptions()) -> tuple[Diagnostic, ...]:
    """Findings for one file's text, suppressions applied, sorted by position."""
    if not any(marker in source for marker in MARKERS):
        return ()
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return (Diagnostic(error.raw_line, error.raw_column + 1, "DDP001", f"cannot parse: {error.message}", Severity.ERROR),)
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    checker = Checker(module)
    wrapper.visit(checker)
    positions = wrapper.resolve(PositionProvider)
    lines = source.splitlines()
    found = set()
    for node, code, ddp_only in checker.findings:
        if ddp_only and not checker.uses_distributed or not options.wants(code):
            continue
        start = positions[node].start
        if not _suppressed(lines[start.line - 1] if start.line <= len(lines) else "", code):
            found.add(Diagnostic(start.line, start.column + 1, code, RULES[code].summary, Severity.WARNING))
    return tuple(sorted(found))


def _suppressed(line: str, code: str) -> bool:
    """`# noqa`, `# noqa: DDP611`, `# ddpify: ignore[DDP611]` (codes by prefix) on the line."""
    match = SUPPRESSION.search(line)
    if match is None:
        return False
    codes = [c.strip() for c in match.group(1).split(",") if c.strip()]
    return not codes or any(code.startswith(c) for c in codes)
