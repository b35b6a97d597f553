"""DDP0xx (no codes of its own): the imports the other transforms scheduled.

Runs last. Imports the converted code needs are added after the script's own imports,
unless the script already has them; ``from torch.nn import DataParallel [as X]`` is removed,
since a file is converted whole, so no use of it is left.

This replaces libcst's AddImportsVisitor/RemoveImportsVisitor: each of those re-resolves
scope metadata for the whole file, which tripled the time of a conversion, while the
analysis already knows every import and every DataParallel use.

    from torch.nn import DataParallel, Linear     ->   from torch.nn import Linear
    import torch                                       import torch
                                                       import torch.distributed as dist
                                                       from torch.nn.parallel import DistributedDataParallel
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.tree import dotted, walk
from ddpify.transforms.base import Block, Transform, is_header, is_import

DP_MODULES = ("torch.nn", "torch.nn.parallel", "torch.nn.parallel.data_parallel")
# An import of a class by one of its paths -> the import the set-up adds for it
SAME_CLASS = {
    ("torch.utils.data", "DistributedSampler", None): [("torch.utils.data.distributed", "DistributedSampler", None)],
    ("torch.nn.parallel.distributed", "DistributedDataParallel", None): [("torch.nn.parallel", "DistributedDataParallel", None)],
}
ImportKey = tuple[str, str | None, str | None]


class ImportsTransform(Transform):
    def __init__(self, context) -> None:
        super().__init__(context)
        self.existing = {key for statement in context.module.body for key in self._keys(statement)}
        # (the same class imported by its other path: EEGround's `from torch.utils.data import DistributedSampler`)
        self.existing |= {same for key in list(self.existing) for same in SAME_CLASS.get(key, ())}

    def _keys(self, statement: cst.BaseStatement) -> list[ImportKey]:
        if not isinstance(statement, cst.SimpleStatementLine):
            return []
        keys: list[ImportKey] = []
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    keys.append((self.context.code(alias.name), None, _alias(alias)))
            elif isinstance(small, cst.ImportFrom) and small.module and not small.relative:
                if not isinstance(small.names, cst.ImportStar):
                    module = self.context.code(small.module)
                    keys += [(module, self.context.code(a.name), _alias(a)) for a in small.names]
        return keys

    def _is_data_parallel(self, module: cst.ImportFrom, alias: cst.ImportAlias) -> bool:
        return self.context.code(module.module) in DP_MODULES and self.context.code(alias.name) == "DataParallel"

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if not self.facts.existing_ddp:  # there, the DataParallel branch stays as it was
            block = self._drop_data_parallel_imports(block)
        if not isinstance(owner, cst.Module):
            return block
        missing = [key for key in self.context.imports_to_add if key not in self.existing]
        statements = [cst.parse_statement(_render(key)) for key in sorted(missing, key=lambda k: (k[1] is not None, k[0], k[1] or ""))]
        at = 0
        while at < len(block) and is_header(block[at][1]):
            at += 1
        rest = block[at:]
        if statements and rest and not any(is_import(updated) for _, updated in block[:at]):
            # The first imports of the file: the code below them keeps two blank lines' distance.
            original, first = rest[0]
            missing = max(0, 2 - sum(1 for line in first.leading_lines if line.comment is None))
            rest = [(original, first.with_changes(leading_lines=[*[cst.EmptyLine()] * missing, *first.leading_lines])), *rest[1:]]
        return [*block[:at], *[(None, s) for s in statements], *rest]

    def _drop_data_parallel_imports(self, block: Block) -> Block:
        """``from torch.nn import DataParallel`` goes where the converted block no longer names
        it (a DataParallel subclass left in a project module still does: its import stays)."""
        used = {
            node.value for _, updated in block if updated is not None and not is_import(updated)
            for node in walk(updated) if isinstance(node, cst.Name)
        }
        kept: Block = []
        carried: list[cst.EmptyLine] = []
        for original, updated in block:
            dropped = self._data_parallel_aliases(original, used)
            if dropped and len(dropped) == len(updated.body[0].names):
                carried += list(updated.leading_lines)
                continue
            if dropped:
                gone = {_bound(alias) for alias in dropped}
                names = [alias for alias in updated.body[0].names if not (self.context.code(alias.name) == "DataParallel" and _bound(alias) in gone)]
                names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                updated = updated.with_changes(body=[updated.body[0].with_changes(names=names)])
            if carried:
                updated = updated.with_changes(leading_lines=[*carried, *updated.leading_lines])
                carried = []
            kept.append((original, updated))
        return kept

    def _data_parallel_aliases(self, statement: cst.BaseStatement | None, used: set[str]) -> list[cst.ImportAlias]:
        """The aliases of a `from torch... import DataParallel` line whose names the block no longer uses."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return []
        small = statement.body[0]
        if not isinstance(small, cst.ImportFrom) or small.module is None or isinstance(small.names, cst.ImportStar):
            return []
        return [alias for alias in small.names if self._is_data_parallel(small, alias) and _bound(alias) not in used]


def _bound(alias: cst.ImportAlias) -> str:
    """The name an import alias binds (`DataParallel`, or its `as` name)."""
    return _alias(alias) or dotted(alias.name) or ""


def _alias(alias: cst.ImportAlias) -> str | None:
    return alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None


def _render(key: ImportKey) -> str:
    module, name, alias = key
    suffix = f" as {alias}" if alias else ""
    return f"from {module} import {name}{suffix}" if name else f"import {module}{suffix}"
