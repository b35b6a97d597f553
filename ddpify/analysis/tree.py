"""Shared tree helpers: reading names, calls and statements of a libcst tree.

Nothing here keeps state about a file except ``walk``'s table of subtrees (filled by the
analysis walk, one per file), and nothing needs metadata.
"""

from __future__ import annotations

import re

import libcst as cst

DEVICE_COUNT = "torch.cuda.device_count"
# Method names that run the model's forward or backward (a DDP collective).
COLLECTIVE_METHODS = {"backward", "forward"}
TRAINING_METHODS = {"backward", "step"}
# Receivers whose step(...) with arguments is still a training step (`optimizer.step(closure)`,
# `scaler.step(optimizer)`).
OPTIMIZER_WORDS = ("opt", "scaler", "solver", "amp", "trainer")
# `scheduler.step()` steps a learning-rate schedule, not a model.
SCHEDULER_WORDS = ("sched", "warmup")


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def is_main_guard(node: cst.CSTNode) -> bool:
    """`if __name__ == "__main__":` (either order, either quotes)."""
    if not isinstance(node, cst.If) or not isinstance(node.test, cst.Comparison):
        return False
    test = node.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = {type(test.left), type(test.comparisons[0].comparator)}
    texts = {getattr(test.left, "value", None), getattr(test.comparisons[0].comparator, "value", None)}
    return sides == {cst.Name, cst.SimpleString} and "__name__" in texts and bool(
        texts & {'"__main__"', "'__main__'"}
    )


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call inside `node`, in source order (a cheap stand-in for matchers.findall)."""
    return [found for found in walk(node) if isinstance(found, cst.Call)]


def bound_names(target: cst.BaseExpression) -> list[str]:
    """`a`, `self.a` for an assignment target; each element of a tuple/list target."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in bound_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return bound_names(target.value)
    name = dotted(target)
    return [name] if name else []


def names_bound_in(statement: cst.CSTNode) -> set[str]:
    """Every name (``a``, ``self.a``) a statement binds, at any depth: ``=``, ``+=``, annotated
    assignments, ``for`` targets, ``with ... as`` / ``except ... as``."""
    bound = set()
    for node in walk(statement):
        if isinstance(node, cst.Assign):
            bound.update(name for target in node.targets for name in bound_names(target.target))
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
            bound.update(bound_names(node.target))
        elif isinstance(node, cst.AsName):
            bound.update(bound_names(node.name))
    return bound


class Subtrees:
    """Every node of one file's tree in source order, and where each node's subtree starts and
    ends in that list: ``walk`` of an original node is then a slice, not a new traversal
    (transforms ask for the calls inside statements many times). Filled by the analysis walk;
    ``walk`` reads the table of the file being analysed or rewritten (``activate``)."""

    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._starts: dict[cst.CSTNode, int] = {}

    def enter(self, node: cst.CSTNode) -> None:
        self._starts[node] = len(self.nodes)
        self.nodes.append(node)

    def leave(self, node: cst.CSTNode) -> None:
        self.spans[node] = (self._starts.pop(node), len(self.nodes))


_active = Subtrees()


def activate(subtrees: Subtrees) -> None:
    """The file whose nodes ``walk`` is asked about from now on."""
    global _active
    _active = subtrees


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and everything below it, in source order."""
    span = _active.spans.get(node)
    if span is not None:
        return _active.nodes[span[0] : span[1]]
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, visited: cst.CSTNode) -> bool:
            found.append(visited)
            return True

    node.visit(Collect())
    return found


def names_in(node: cst.CSTNode) -> list[cst.Name]:
    return [n for n in walk(node) if isinstance(n, cst.Name)]


def imports(statement: cst.CSTNode) -> bool:
    """A top-level statement that imports (``import x``, ``from x import y``)."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def returns(function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The values a function returns (not those of functions nested in it)."""
    found: list[cst.BaseExpression] = []

    class Returns(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            if node.value is not None:
                found.append(node.value)

    function.visit(Returns())
    return found


def first_positional(call: cst.Call, keyword: str | None = None) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is None and arg.star == "":
            return arg.value
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    return None


def argument_in_slot(call: cst.Call, slot: tuple[int, str]) -> cst.BaseExpression | None:
    """The argument a call passes at ``slot`` (position, keyword): the model of a wrap."""
    index, keyword = slot
    positional = [arg for arg in call.args if arg.keyword is None and arg.star != "**"]
    for at, arg in enumerate(positional[: index + 1]):
        if arg.star:
            return None  # `*args` before it: which one cannot be told
        if at == index:
            return arg.value
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == keyword), None)


def assigned_in(statement: cst.CSTNode) -> set[str]:
    """The names and attributes a statement binds or changes, anywhere inside it (``x = ...``,
    ``a, b = ...``, ``x += 1``, ``self.model = ...``)."""
    found = set()
    for node in walk(statement):
        if isinstance(node, cst.Assign):
            found.update(name for target in node.targets for name in bound_names(target.target))
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and node.value is not None:
            found.update(filter(None, [dotted(node.target)]))
    return found


def binding_targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """What a statement binds: an assignment's targets (augmented and annotated too), a ``for``
    loop's own target."""
    if isinstance(node, cst.Assign):
        return [target.target for target in node.targets]
    if isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
        return [node.target]
    return []


# Methods that move or cast a module and return it.
MOVES = ("cuda", "to", "cpu", "float", "double", "half")


def without_moves(value: cst.BaseExpression) -> cst.BaseExpression:
    """``Head(...)`` of ``Head(...).cuda()`` / ``.to(device)``: the object made, not its move."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MOVES:
        value = value.func.value
    return value


# what a tensor is read as a number or a plain copy through (``loss.detach().cpu().item()``)
NUMBER_READS = ("float", "double", "item", "long", "int", "detach", "cpu", "cuda", "clone")


def unconverted(value: cst.BaseExpression) -> cst.BaseExpression:
    """``n.float()``, ``m.mean().item()``, ``(torch.sum(mask).cpu().data).item()``, ``float(n)``,
    ``n.to(device)``: the value inside its conversions to a number, a device or a detached tensor."""
    while True:
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in NUMBER_READS and not value.args:
            value = value.func.value
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda"):
            value = value.func.value  # (a move to a device: autoplace's `nNeg.float().to(device)`)
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("float", "int") and len(value.args) == 1:
            value = value.args[0].value
        elif isinstance(value, cst.Attribute) and value.attr.value == "data":
            value = value.value  # (InverseRendering's `.cpu().data`)
        else:
            return value


def calls_bound(module: cst.Module) -> dict[str, list[cst.Call]]:
    """Each name (``criterion``, ``self.cam``) -> the calls assigned to it, moves left out
    (``nn.CrossEntropyLoss().cuda()``; a move re-bound, ``loss_fn = loss_fn.cuda()``, binds
    nothing new)."""
    bound: dict[str, list[cst.Call]] = {}
    for node in walk(module):
        value = without_moves(node.value) if isinstance(node, cst.Assign) else None
        if isinstance(value, cst.Call):
            for target in node.targets:
                bound.setdefault(dotted(target.target) or "", []).append(value)
    return bound


def root_name(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, (cst.Attribute, cst.Call, cst.Subscript)):
        node = node.value if not isinstance(node, cst.Call) else node.func
    return node if isinstance(node, cst.Name) else None


def iterator_of(call: cst.BaseExpression) -> cst.BaseExpression | None:
    """What ``iter(x)`` or ``x.__iter__()`` (pase's ``next(dloader.__iter__())``) iterates."""
    if not isinstance(call, cst.Call):
        return None
    if dotted(call.func) == "iter" and call.args:
        return call.args[0].value
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "__iter__" and not call.args:
        return call.func.value
    return None


def batch_length(value: cst.BaseExpression) -> bool:
    """``x.shape[0]``, ``x.size(0)``, ``x.size()[0]``, ``len(x)``: how many samples a batch holds."""
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Attribute) and value.value.attr.value == "shape":
        return True
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call) and not value.value.args:
        sized = value.value.func  # TinyBERT's `input_ids.size()[0]`
        if isinstance(sized, cst.Attribute) and sized.attr.value == "size":
            return True
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size":
        return True
    return isinstance(value, cst.Call) and dotted(value.func) == "len"


SCALER_NAME = re.compile(r"scaler|step", re.IGNORECASE)


def is_training_call(call: cst.Call) -> bool:
    """``loss.backward()``, ``optimizer.step()``; not ``scheduler.step()``; a step helper handed
    the loss and the optimizer (timm's NativeScaler: ``loss_scaler(loss, optimizer, ...)``,
    Uformer), which runs both."""
    if _steps_with(call):
        return True
    if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in TRAINING_METHODS:
        return False
    if call.func.attr.value == "backward":
        return True
    receiver = (dotted(call.func.value) or "").lower()
    if call.args and not any(word in receiver for word in OPTIMIZER_WORDS):
        return False  # votenet's `ap_calculator.step(preds, labels)`: a metric's step, given data
    return not any(word in receiver for word in SCHEDULER_WORDS)


def _steps_with(call: cst.Call) -> bool:
    """``loss_scaler(loss, optimizer, ...)``: a callable given a loss and an optimizer by name."""
    names = [(dotted(arg.value) or "").lower() for arg in call.args if arg.keyword is None]
    if len(names) < 2 or not isinstance(call.func, cst.Name) or not SCALER_NAME.search(call.func.value):
        return False
    return "loss" in names[0] and any(word in names[1] for word in OPTIMIZER_WORDS)


def is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def backwards_per_pass(node: cst.CSTNode) -> int:
    """backward() calls one pass through ``node`` makes: `if fp16: scaled.backward() else:
    loss.backward()` is one, not two."""
    if isinstance(node, cst.If) and node.orelse is not None:
        other = node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse
        return _count_backwards(node.test) + max(backwards_per_pass(node.body), backwards_per_pass(other))
    if isinstance(node, cst.Call):
        return int(is_backward(node)) + sum(backwards_per_pass(child) for child in node.children)
    return sum(backwards_per_pass(child) for child in node.children)


def _count_backwards(node: cst.CSTNode) -> int:
    return sum(1 for found in walk(node) if isinstance(found, cst.Call) and is_backward(found))


# A context or decorator that turns gradients off.
GRADIENT_OFF = re.compile(r"\b(no_grad|inference_mode)\b")


def without_gradients(node: cst.CSTNode, parent_of, code_of) -> bool:
    """Inside ``with torch.no_grad():`` (or a function decorated with it): nothing there
    reaches a backward()."""
    node = parent_of(node)
    while node is not None and not isinstance(node, cst.Module):
        if isinstance(node, cst.With) and any(GRADIENT_OFF.search(code_of(item.item)) for item in node.items):
            return True
        if isinstance(node, cst.FunctionDef):
            return any(GRADIENT_OFF.search(code_of(d.decorator)) for d in node.decorators)
        node = parent_of(node)
    return False


def enclosing_function(node: cst.CSTNode, parent_of) -> cst.FunctionDef | None:
    """The function ``node`` is written in (the innermost), None at module level."""
    node = parent_of(node)
    while node is not None and not isinstance(node, cst.FunctionDef):
        node = parent_of(node)
    return node


def innermost_loop(node: cst.CSTNode, parent_of) -> cst.CSTNode | None:
    """The loop right around ``node`` in its function (or the function, or the module)."""
    node = parent_of(node)
    while node is not None and not isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.Module)):
        node = parent_of(node)
    return node


def loop_origins(loop: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
    """Every name the loop binds (``=``, ``+=``) -> the values bound to it, in order; a list's
    name -> what is appended to it too (``all_losses.append(w * F.smooth_l1_loss(...))``)."""
    origins: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(loop.body):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("append", "extend"):
            if isinstance(node.func.value, cst.Name) and len(node.args) == 1:
                origins.setdefault(node.func.value.value, []).append(node.args[0].value)
        if isinstance(node, (cst.Assign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                for name, value in _paired(target, node.value):
                    origins.setdefault(name, []).append(value)
    return origins


def _paired(target: cst.BaseExpression, value: cst.BaseExpression) -> list[tuple[str, cst.BaseExpression]]:
    """Each name a target binds -> its value: element by element where a tuple of names takes a
    tuple written out (``logits, keep = model(x), y != 255``), else the whole value."""
    elements = (cst.Tuple, cst.List)
    if isinstance(target, elements) and isinstance(value, elements) and len(target.elements) == len(value.elements):
        if not any(isinstance(e, (cst.StarredElement,)) for e in (*target.elements, *value.elements)):
            return [pair for t, v in zip(target.elements, value.elements) for pair in _paired(t.value, v.value)]
    return [(name.value, value) for name in walk(target) if isinstance(name, cst.Name)]


def backward_takes(step: cst.CSTNode) -> list[cst.BaseExpression]:
    """What a training step's backward() calls take; in a function without a backward() of
    its own (a loss function a step calls), what it returns."""
    taken = [call.func.value for call in calls_in(step.body) if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"]
    if not taken and isinstance(step, cst.FunctionDef):
        taken = [node.value for node in walk(step.body) if isinstance(node, cst.Return) and node.value is not None]
    return taken


def reaching_backward(loop: cst.CSTNode, origins: dict[str, list[cst.BaseExpression]]) -> list[cst.BaseExpression]:
    """What the loop's backward() calls take, and the values of the names it reads, and so on.
    In a function without a backward() of its own (a loss function a step calls), what it
    returns takes the place of what backward() takes."""
    pending = backward_takes(loop)
    seen: set[str] = set()
    reached: list[cst.BaseExpression] = []
    while pending:
        expr = pending.pop()
        reached.append(expr)
        for name in {n.value for n in walk(expr) if isinstance(n, cst.Name)} - seen:
            seen.add(name)
            pending += origins.get(name, [])
    return reached


def own_nodes(scope: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node of a function or module in document order, the functions, classes and
    lambdas defined in it left out (their own scopes)."""
    found, stack = [], [scope]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(reversed([child for child in node.children if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda))]))
    return found


def differentiated(scope: cst.CSTNode) -> set[str]:
    """Names backward() is called on in ``scope`` (``avg.backward()``): losses whose gradient DDP averages."""
    return {dotted(node.func.value) for node in walk(scope) if isinstance(node, cst.Call) and is_backward(node)} - {None}


def scope_of(node: cst.CSTNode, parent_of) -> cst.CSTNode:
    """The function ``node`` is written in (the innermost), else the module."""
    while not isinstance(node, (cst.FunctionDef, cst.Module)):
        node = parent_of(node)
    return node


def statement_of(node: cst.CSTNode | None, parent_of) -> cst.BaseStatement | None:
    """The statement a node is part of."""
    while node is not None and not isinstance(node, cst.BaseStatement):
        node = parent_of(node)
    return node


def derived_from(names: set[str], body: cst.CSTNode) -> set[str]:
    """``names`` and the names the body binds from them, through other such names
    (DiffGAN-TTS: ``G_loss`` of ``Loss(model, batch, output)``, then ``model_update(model,
    step, G_loss, opt)``: a step on the batch)."""
    derived = set(names)
    assignments = [node for node in walk(body) if isinstance(node, (cst.Assign, cst.AugAssign))]
    grown = True
    while grown:
        grown = False
        for node in assignments:
            used = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            bound = {n.value for target in targets for n in walk(target) if isinstance(n, cst.Name)}
            if used & derived and not bound <= derived:
                derived |= bound
                grown = True
    return derived


def ends_after(node: cst.CSTNode, block: cst.CSTNode, jumps=(cst.Return, cst.Raise)) -> bool:
    """Does the block run one of ``jumps`` (a ``return``, a ``raise``) in a statement of its own
    after ``node``? What follows the block never runs after ``node`` then."""
    body = list(getattr(block, "body", ())) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
    return node in body and any(
        isinstance(line, cst.SimpleStatementLine) and any(isinstance(small, jumps) for small in line.body)
        for line in body[body.index(node) + 1 :]
    )


def ended_block(statement: cst.CSTNode, scope: cst.CSTNode, parent_of) -> cst.CSTNode | None:
    """The innermost block around ``statement`` (within ``scope``) whose run ends after it in a
    ``return``, ``raise``, ``break`` or ``continue`` (VAC_CSLR's vendored convert_model: ``mod =
    DataParallelWithCallback(mod, ...); return mod`` in an ``if``, then ``mod = module`` for every
    other module); None where the path goes on past every block."""
    node = statement
    while node is not None and node is not scope:
        block = parent_of(node)
        if ends_after(node, block, (cst.Return, cst.Raise, cst.Break, cst.Continue)):
            return block
        node = block
    return None

