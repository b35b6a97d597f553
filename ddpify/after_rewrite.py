"""Checks of a rewrite's text before it is written (DDP002, DDP003).

Whatever a transform did, a result that would not run as one distributed job is never
written: the file is left as it was and the report says why. These checks read the
output with Python's own parser (``ast``), independently of the analysis that planned the
rewrite, so a defect of the analysis cannot hide from them.

- DDP002: the rewrite does not compile where the original does, or puts a collective after
  a ``return``/``raise``/``break``/``continue`` of its block (no rank reaches it: a hang).
- DDP002 too: the rewrite puts a collective (a ``dist`` call, or a function of the file that
  makes one: ``ddp_agreed``, ``ddp_mean``, ...) inside a block only rank 0 runs (``if
  ddp_rank() == 0:``): the other ranks never join it (a hang).
- DDP003: the rewrite still builds torch's DataParallel (a form the analysis did not
  recognise as torch's): under torchrun every rank would run its own DataParallel job, or
  crash at the first forward; the message names why the name was not recognised.

Before (a DataParallel the analysis missed, ``nn`` bound by a project module's import)::

    from model import Generator, nn
    net = nn.DataParallel(Generator())   # left as it was, while loaders were sharded

After: nothing written; ``DDP003 `nn.DataParallel(...)` (line 2) would still build
DataParallel: `nn` is imported from model, ...``.
"""

from __future__ import annotations

import ast

from ddpify.diagnostics import suppressed

# The callee names that build torch's DataParallel (attribute or bare name).
BUILDERS = ("DataParallel", "data_parallel")


def rewrite_does_not_compile(source: str, output: str) -> str | None:
    """Why the converted text does not compile on this Python where the original does (a
    rewrite that spliced code where this grammar refuses it): never written."""
    try:
        compile(output, "<converted>", "exec", dont_inherit=True)
        return None
    except SyntaxError as error:
        try:
            compile(source, "<original>", "exec", dont_inherit=True)
        except SyntaxError:
            return None  # (the original does not compile here either: a newer Python's file)
        return (
            f"the rewrite does not compile on this Python (line {error.lineno} of the result: {error.msg}); "
            "a ddpify defect, please report it with the file"
        )


def collective_never_reached(source: str, output: str) -> str | None:
    """A collective the rewrite put after a ``return``/``raise``/``break``/``continue`` of its
    block: the ranks that pass it would wait for ranks that never come (a hang). Never written."""
    found = _unreachable_collectives(output)
    if found is None or found <= (_unreachable_collectives(source) or 0):
        return None
    return "the rewrite puts a collective after a return or raise of its block, where no rank reaches it (a hang); a ddpify defect, please report it with the file"


def _unreachable_collectives(text: str) -> int | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    count = 0
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            ends = next((i for i, statement in enumerate(block) if isinstance(statement, (ast.Return, ast.Raise, ast.Break, ast.Continue))), None)
            for statement in block[ends + 1:] if ends is not None else ():
                count += any(
                    isinstance(call, ast.Call) and (
                        isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "dist"
                        or isinstance(call.func, ast.Name) and call.func.id.startswith("ddp_")
                    )
                    for call in ast.walk(statement)
                )
    return count


# torch.distributed's calls that every rank of the group must make.
COLLECTIVES = {
    "barrier", "broadcast", "all_reduce", "all_gather", "gather", "scatter", "reduce", "broadcast_object_list",
    "all_gather_object", "gather_object", "scatter_object_list", "all_to_all", "reduce_scatter", "all_gather_into_tensor",
    "reduce_scatter_tensor", "monitored_barrier",
}
RANK_CALLS = {"ddp_rank", "dist.get_rank", "torch.distributed.get_rank"}


def collective_for_rank_zero_alone(source: str, output: str) -> str | None:
    """A collective the rewrite put inside a block only rank 0 runs (two rewrites of one
    statement: Jacqueline121/RetinaNet_pytorch's `if not os.path.exists(d): os.mkdir(d)` guarded
    for rank 0 whole, its test agreed by a broadcast): rank 0 waits in it while the others wait
    at the barrier after the block. Never written."""
    found = _collectives_for_rank_zero(output)
    if not found or len(found) <= len(_collectives_for_rank_zero(source)):
        return None
    line, name = found[0]
    return (
        f"the rewrite puts a collective (`{name}(...)`, line {line} of the result) inside a block only rank 0 runs: the "
        "other ranks never join it (a hang); a ddpify defect, please report it with the file"
    )


def _collectives_for_rank_zero(text: str) -> list[tuple[int, str]]:
    """(line, callee) of each collective call inside an `if <rank> == 0:` body, outside the
    emitted helpers (``ddp_*`` functions and ``Ddp*`` classes, which decide for themselves)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    collective = _collective_functions(tree)

    def made_in(block: list[ast.stmt]) -> list[tuple[int, str]]:
        return [
            (call.lineno, name) for statement in block for call in ast.walk(statement) if isinstance(call, ast.Call)
            for name in [_callee(call)]
            if name is not None and (name in collective or _a_collective(name))
        ]

    found, paired = [], []
    for node in _outside_helpers(tree):
        if isinstance(node, ast.If) and _rank_test(node.test, ast.Eq):
            found += made_in(node.body)
            paired += made_in(node.orelse)
        elif isinstance(node, ast.If) and _rank_test(node.test, ast.NotEq):
            paired += made_in(node.body)
        elif isinstance(node, ast.IfExp) and _rank_test(node.test, ast.Eq):
            # (`ddp_from_rank_zero(ddp_from_rank_zero(input() if rank == 0 else None) if rank == 0 else None)`:
            # two rewrites of one input(), BERT4Rec-VAE's end-of-run question, batch 46)
            found += made_in([node.body])
    # (rank 0 first: `if rank != 0: dist.barrier()` ... `if rank == 0: dist.barrier()` meet)
    for _, name in paired:
        match = next((item for item in found if item[1] == name), None)
        if match is not None:
            found.remove(match)
    return found


def _collective_functions(tree: ast.Module) -> set[str]:
    """The file's top-level functions that make a collective, themselves or through another
    of them (a bare call names a top-level function; a method of the same name is another:
    a review's `summary(values)` beside `Checkpointer.summary(self, path)`, which saves)."""
    functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    called = {f.name: {_callee(c) for c in ast.walk(f) if isinstance(c, ast.Call)} - {None} for f in functions}
    found = {name for name, calls in called.items() if any(_a_collective(c) for c in calls)} | {"ddp_wrap"}
    grown = True
    while grown:
        grown = False
        for name, calls in called.items():
            if name not in found and calls & found:
                found.add(name)
                grown = True
    return found


def _a_collective(callee: str) -> bool:
    """`dist.barrier`, `torch.distributed.all_reduce`, ..."""
    module, _, name = callee.rpartition(".")
    return module in ("dist", "torch.distributed") and name in COLLECTIVES


def _outside_helpers(tree: ast.Module):
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.lower().startswith("ddp"):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and isinstance(func.value.value, ast.Name):
        return f"{func.value.value.id}.{func.value.attr}.{func.attr}"
    return None


def _rank_test(test: ast.expr, op: type) -> bool:
    """`ddp_rank() == 0` (op Eq) or `!= 0` (NotEq), `dist.get_rank()` alike; alone or in an `and`."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and op is ast.Eq:
        return any(_rank_test(value, op) for value in test.values)
    return (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], op)
        and isinstance(test.left, ast.Call) and _callee(test.left) in RANK_CALLS
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0
    )


def data_parallel_left(text: str) -> str | None:
    """Why ``text`` still builds torch's DataParallel (``nn.DataParallel(...)``,
    ``torch.nn.parallel.data_parallel(...)``, or a bare ``DataParallel(...)`` that this file
    does not define itself), or None. Read before a file is written, so a wrap the analysis
    missed refuses the file instead of leaving N DataParallel jobs under torchrun."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    defined = {
        node.name for node in ast.walk(tree) if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    lines = text.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _suppressed(lines[node.lineno - 1]):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and _builds_by_attribute(func):
            return _why_left(tree, node, _root(func))
        if isinstance(func, ast.Name) and func.id in BUILDERS and func.id not in defined and _imported_from_torch(tree, func.id):
            return _why_left(tree, node, func.id)
    return None


def _builds_by_attribute(func: ast.Attribute) -> bool:
    """`nn.DataParallel`, `torch.nn.parallel.DataParallel`, `nn.parallel.data_parallel`
    (not a method of the script's own object: `self.data_parallel(x)`)."""
    root = _root(func)
    if root is None or root in ("self", "cls"):
        return False
    if func.attr == "DataParallel":
        return True
    return func.attr == "data_parallel" and isinstance(func.value, ast.Attribute) and func.value.attr == "parallel"


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _imported_from_torch(tree: ast.Module, name: str) -> bool:
    """A bare name bound by an import from torch, or by nothing but a star import."""
    bound = _binding(tree, name)
    return bound is None and _star_imports(tree) != [] or bound is not None and bound.startswith("torch")


def _binding(tree: ast.Module, name: str) -> str | None:
    """The module an import binds ``name`` from (``from model import nn`` -> "model";
    ``import torch.nn as nn`` -> "torch.nn"), or None if no import binds it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    return alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return "." * node.level + (node.module or "")
    return None


def _star_imports(tree: ast.Module) -> list[str]:
    return [
        "." * node.level + (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)
    ]


def _why_left(tree: ast.Module, call: ast.Call, root: str) -> str:
    spelled = ast.unparse(call.func)
    where = f"`{spelled}(...)` (line {call.lineno}) would still build DataParallel after the conversion"
    bound, stars = _binding(tree, root), _star_imports(tree)
    if bound is not None and not bound.startswith("torch"):
        cause = (
            f"`{root}` is imported from {bound}, which ddpify could not follow to torch; import it from torch here "
            f"(`import torch.nn as nn`, `from torch.nn import DataParallel`) and convert again"
        )
    elif bound is None and stars:
        cause = (
            f"`{root}` comes from `from {stars[0]} import *`, which ddpify could not follow to torch; import it from "
            f"torch here (`import torch.nn as nn`) and convert again, or convert the folder (`ddpify convert DIR`) so "
            "that module is read"
        )
    else:
        cause = "ddpify did not recognise this form as torch's DataParallel; a ddpify defect, please report it with the file"
    return f"{where}: {cause}"


def _suppressed(line: str) -> bool:
    """`# ddpify: ignore[DDP003]` or `# noqa: DDP003` on the line: a bare `# noqa` (a line
    too long for a linter) does not let a DataParallel through."""
    return "DDP003" in line and suppressed(line, "DDP003")
