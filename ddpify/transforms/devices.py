"""DDP7xx: hard-coded devices become this process's device.

``ddp_setup()`` calls ``torch.cuda.set_device(local_rank)``, so the bare ``"cuda"`` device
and a bare ``.cuda()`` already mean "this process's GPU". Hard-coded indices are dropped
rather than replaced by expressions: the smallest rewrite that is right on every rank.

DDP701  "cuda:N" device string -> "cuda"::

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    # becomes
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

Likewise a GPU by its index: ``torch.device(0)`` and ``torch.device("cuda", 0)`` become
``torch.device("cuda")``, and ``x.to(1)`` becomes ``x.to("cuda")``.

DDP702  ``.cuda(N)`` -> ``.cuda()``, whatever names the index (``.cuda(gpus_list[0])``, ``.cuda(device=d)``,
``.cuda(args.gpu)``): each process uses its own GPU; keywords stay::

    x = x.cuda(0)        ->   x = x.cuda()

DDP706  a read of ``os.environ["CUDA_VISIBLE_DEVICES"]`` after DDP703 removed its assignment
(liif counts its GPUs from it) gets the removed value as its default::

    n_gpus = len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))
    # becomes
    n_gpus = len(os.environ.get("CUDA_VISIBLE_DEVICES", str(args.gpu)).split(','))

DDP703  in-script ``CUDA_VISIBLE_DEVICES`` removed; GPUs are chosen on the launch line::

    os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"
    # becomes
    # ddpify: removed os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"; choose GPUs on the launch
    # line: CUDA_VISIBLE_DEVICES=0,3 torchrun --standalone --nproc-per-node=2 train.py

DDP705  ``torch.load`` without ``map_location`` loads onto the device it was saved from
(usually GPU 0, for every rank): what was saved on a GPU loads onto this process's device, what
was saved on the CPU stays there (a Dataset's tensors must stay off the GPU for forked
DataLoader workers)::

    state = torch.load("model.pt")  ->  state = torch.load("model.pt", map_location=ddp_map_location)

DDP704  ``torch.cuda.set_device(N)`` on a line of its own is removed: it would put every
rank on GPU N, over the GPU chosen by set-up (inside an expression it is left alone, a
warning)::

    torch.cuda.set_device(opt.gpu_ids[0])
    # becomes
    # ddpify: removed torch.cuda.set_device(opt.gpu_ids[0]); ddp_setup() sets this process's GPU

DDP707  ``.to(device)`` with a device named by settings this file does not hold (a field of
an imported module, GST-Tacotron's ``hp.device = 'cuda:0'``; a name imported from one; a field
of the parsed command line, ``--device cuda:0``): a CUDA device there becomes this process's at
run time, anything else stays as it is::

    model.to(hp.device)   ->   model.to(ddp_here(hp.device))

A device kept from settings a function is handed (WoodScape's ``self.device = args.device``) is
made this process's where it is kept::

    self.device = args.device   ->   self.device = ddp_here(args.device)

DDP701 also covers device strings built from an index: ``f"cuda:{gpu}"``,
``"cuda:{}".format(gpu)``, ``"cuda:%d" % gpu`` and ``"cuda:" + str(gpu)`` become ``"cuda"``; a
kind given at run time with an index (DBE's ``'{}:{}'.format(args.device, device_ids[0])``,
``f"{kind}:{gpu}"``) becomes the kind alone.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis import calls_in, dotted, enclosing_function, in_data_loading, walk
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Block, Transform, append_arg, keyword, keyword_arg, positional_args

CUDA_INDEX = re.compile(r"cuda:\d+(,\d+)*")  # (PMG's "cuda:0,1" named the GPUs DataParallel used)


class DevicesTransform(Transform):
    CODE_PREFIX = "DDP7"

    def check(self) -> None:
        # the CUDA_VISIBLE_DEVICES assignments edit_block removes: what reads of it fall back to
        self._removed_visible: list[tuple[cst.SimpleStatementLine, str, bool]] = []
        for node in walk(self.context.module):
            found = self._visible_devices_value(node) if isinstance(node, (cst.SimpleStatementLine, cst.If)) else None
            if found is not None:
                self._removed_visible.append((node, *found))

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        """``len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))`` after ddpify removed the
        assignment (liif): read with the removed value as its default, not a KeyError."""
        if not self._removed_visible or not self._reads_visible_devices(original_node):
            return updated_node
        default = self._visible_default(original_node)
        self.context.report(
            original_node,
            "DDP706",
            f"os.environ['CUDA_VISIBLE_DEVICES'] is read after its assignment was removed (DDP703): "
            f"os.environ.get('CUDA_VISIBLE_DEVICES', {default}), the launch line's value when it sets one",
        )
        return cst.parse_expression(f'os.environ.get("CUDA_VISIBLE_DEVICES", {default})')

    def _reads_visible_devices(self, node: cst.Subscript) -> bool:
        parent = self.context.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.Del)) or "os.environ" not in self.context.qualified(node.value):
            return False
        key = node.slice[0].slice if len(node.slice) == 1 else None
        return isinstance(key, cst.Index) and _literal(key.value) == "CUDA_VISIBLE_DEVICES"

    def _visible_default(self, read: cst.Subscript) -> str:
        """The removed value where it can be read here (a literal, or an expression of the same
        function or of module-level names), else "0"."""
        statement, value, literal = self._removed_visible[0]
        if literal:
            return repr(value)
        here, there = enclosing_function(read, self.context.parent), enclosing_function(statement, self.context.parent)
        if here is there or there is None:
            return f"str({value})"
        return '"0"'

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        value = original_node.evaluated_value
        if not isinstance(value, str) or not CUDA_INDEX.fullmatch(value):
            return updated_node
        parent = self.context.parent(original_node)
        if isinstance(parent, cst.DictElement) and parent.key is original_node:
            # `map_location={'cuda:0': 'cpu'}`: where the checkpoint was saved, not a device to
            # use (PIDNet: "cuda" matched nothing and every rank loaded onto GPU 0)
            return updated_node
        if self._replaced(original_node):
            return updated_node
        self.context.report(original_node, "DDP701", f'"{value}" -> "cuda": this process\'s GPU, set by ddp_setup()')
        prefix = original_node.prefix
        quote = original_node.quote
        return updated_node.with_changes(value=f"{prefix}{quote}cuda{quote}")

    def leave_FormattedString(self, original_node: cst.FormattedString, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        parts = original_node.parts
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        ):
            return self._bare_cuda(original_node, original_node.start + "cuda:{" + self.context.code(parts[1].expression) + "}" + original_node.end)
        if (
            len(parts) == 3 and isinstance(parts[0], cst.FormattedStringExpression) and isinstance(parts[1], cst.FormattedStringText)
            and parts[1].value == ":" and isinstance(parts[2], cst.FormattedStringExpression)
            and not parts[0].format_spec and not parts[0].conversion
        ):
            return self._kind_alone(original_node, parts[0].expression)
        return updated_node

    def _replaced(self, node: cst.CSTNode) -> bool:
        """Inside a device value the wrap's rewrite replaces whole (DDP147)."""
        while node is not None and not isinstance(node, cst.BaseStatement):
            if node in self.context.replaced_devices:
                return True
            node = self.context.parent(node)
        return False

    def _kind_alone(self, original_node: cst.CSTNode, kind: cst.BaseExpression) -> cst.BaseExpression:
        """``'{}:{}'.format(args.device, device_ids[0])``, ``f"{kind}:{gpu}"``: a device of a
        kind given at run time and a GPU index (DBE) -> the kind alone: "cuda", this process's
        GPU, or "cpu" as it was."""
        if self._replaced(original_node):
            return kind.deep_clone()
        shown = self.context.code(original_node)
        self.context.report(original_node, "DDP701", f"{shown} -> {self.context.code(kind)}: the device's index dropped (\"cuda\" is this process's GPU, set by ddp_setup())")
        return kind.deep_clone()

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        left = _literal(original_node.left)
        if (isinstance(original_node.operator, cst.Modulo) and left in ("cuda:%d", "cuda:%s", "cuda:%i")) or (
            isinstance(original_node.operator, cst.Add) and left == "cuda:"
        ):
            return self._bare_cuda(original_node, self.context.code(original_node))
        return updated_node

    def _bare_cuda(self, original_node: cst.CSTNode, shown: str) -> cst.SimpleString:
        """A device string built from a GPU index -> "cuda", this process's GPU."""
        if self._replaced(original_node):
            return cst.SimpleString('"cuda"')
        self.context.report(original_node, "DDP701", f'{shown} -> "cuda": this process\'s GPU, set by ddp_setup()')
        return cst.SimpleString('"cuda"')

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "format"
            and _literal(func.value) in ("cuda:{}", "cuda:{0}")
            and len(original_node.args) == 1
        ):
            return self._bare_cuda(original_node, self.context.code(original_node))
        if (
            isinstance(func, cst.Attribute) and func.attr.value == "format" and _literal(func.value) in ("{}:{}", "{0}:{1}")
            and len(original_node.args) == 2 and not any(arg.keyword or arg.star for arg in original_node.args)
        ):
            return self._kind_alone(original_node, updated_node.args[0].value)
        if "torch.device" in self.context.qualified(func) and self._indexed_device(original_node):
            # `torch.device(0)`, `torch.device("cuda", 0)` (deeplabv3plus-pytorch): GPU 0 on every rank
            shown = self.context.code(original_node)
            self.context.report(original_node, "DDP701", f'{shown} -> torch.device("cuda"): this process\'s GPU, set by ddp_setup()')
            return updated_node.with_changes(args=[cst.Arg(cst.SimpleString('"cuda"'))])
        if isinstance(func, cst.Attribute) and func.attr.value == "to" and original_node.args and (
            original_node.args[0].keyword is None and isinstance(original_node.args[0].value, cst.Integer)
        ):
            shown = self.context.code(original_node.args[0].value)
            self.context.report(original_node, "DDP701", f'.to({shown}) -> .to("cuda"): this process\'s GPU, set by ddp_setup()')
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=cst.SimpleString('"cuda"')), *updated_node.args[1:]])
        if isinstance(func, cst.Attribute) and func.attr.value == "to" and original_node.args and (
            original_node.args[0].keyword is None and self._unseen_setting(original_node.args[0].value)
        ):
            # (GST-Tacotron's `model.to(hp.device)`, `hp.device = 'cuda:0'` in the project's settings:
            # GPU 0 on every rank, after the wrap put the model on this process's)
            shown = self.context.code(original_node.args[0].value)
            self.context.use_helper("ddp_here")
            self.context.report(
                original_node, "DDP707",
                f".to({shown}): a device from settings this file does not show; a CUDA device there becomes this "
                "process's (ddp_here)",
            )
            moved = cst.Call(func=cst.Name("ddp_here"), args=[cst.Arg(updated_node.args[0].value)])
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=moved), *updated_node.args[1:]])
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            args = positional_args(original_node)
            named = keyword_arg(original_node, "device")
            if (args or named is not None) and not _is_module_call(func) and not self._imported_module(func.value):
                # `.cuda(0)`, `.cuda(gpus_list[0])`, `.cuda(args.gpu)`, `.cuda(device=params.device[0])`
                # (Rotation-RetinaNet, a GPU from its YAML): a GPU the single DataParallel process
                # chose; each DDP process uses its own.
                shown = self.context.code(args[0].value) if args else f"device={self.context.code(named.value)}"
                self.context.report(original_node, "DDP702", f".cuda({shown}) -> .cuda(): this process's GPU")
                kept = [arg for arg in updated_node.args if arg.keyword is not None and arg.keyword.value != "device"]
                if kept:
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return updated_node.with_changes(args=kept)
        if "torch.load" in self.context.qualified(func) and not in_data_loading(original_node, self.context.parent):
            loaded = self._loaded_here(original_node, updated_node)  # (not in a worker process: no CUDA of its own)
            if loaded is not None:
                return loaded
        if "torch.cuda.set_device" in self.context.qualified(func) and not self._is_set_device(
            self.context.parent(self.context.parent(original_node))
        ):
            self.context.report(
                original_node,
                "DDP704",
                "torch.cuda.set_device() inside an expression overrides the GPU ddp_setup() chose for this process; remove it",
                Severity.WARNING,
            )
        return updated_node

    def _indexed_device(self, call: cst.Call) -> bool:
        """A GPU by its index: `torch.device(0)`, `torch.device("cuda", n)`."""
        args = call.args
        if any(arg.keyword is not None or arg.star for arg in args):
            return False
        if len(args) == 1:
            return isinstance(args[0].value, cst.Integer)
        return len(args) == 2 and _literal(args[0].value) == "cuda"

    def _unseen_setting(self, value: cst.BaseExpression) -> bool:
        """A device named by settings whose value this file does not hold: a field of an
        imported module (``hp.device``), a name imported from one (``from config import
        device``), a field of the parsed command line (``args.device``, ``--device cuda:0``), or
        of settings a function is handed (WoodScape's trainers: ``self.device = args.device``)."""
        if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and "device" in value.attr.value.lower():
            return self._imported_module(value.value) or self._parsed_arguments(value.value) or self._a_parameter(value.value)
        if isinstance(value, cst.Name) and "device" in value.value.lower():
            scope = self.context.metadata.get_metadata(ScopeProvider, value, None)
            assignments = list(scope[value.value]) if scope is not None else []
            return bool(assignments) and all(isinstance(getattr(a, "node", None), cst.ImportFrom) for a in assignments)
        return False

    def _a_parameter(self, name: cst.Name) -> bool:
        """A parameter of the function around it, other than `self`/`cls` (settings handed in)."""
        if name.value in ("self", "cls"):
            return False
        scope = self.context.metadata.get_metadata(ScopeProvider, name, None)
        assignments = list(scope[name.value]) if scope is not None else []
        return bool(assignments) and all(isinstance(getattr(a, "node", None), cst.Param) for a in assignments)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """``self.device = args.device``: the device a CUDA setting names becomes this process's
        where it is kept, so every later ``.to(self.device)`` is (DDP707)."""
        targets = original_node.targets
        if len(targets) != 1 or "device" not in (dotted(targets[0].target) or "").rpartition(".")[2].lower():
            return updated_node
        if not self._unseen_setting(original_node.value):
            return updated_node
        shown = self.context.code(original_node.value)
        self.context.use_helper("ddp_here")
        self.context.report(
            original_node, "DDP707",
            f"`{self.context.code(targets[0].target)} = {shown}`: a device from settings this file does not show; a CUDA "
            "device there becomes this process's (ddp_here)",
        )
        return updated_node.with_changes(value=cst.Call(func=cst.Name("ddp_here"), args=[cst.Arg(updated_node.value)]))

    def _parsed_arguments(self, name: cst.Name) -> bool:
        """``args`` bound by ``parser.parse_args()`` (or ``parse_known_args()[0]``)."""
        scope = self.context.metadata.get_metadata(ScopeProvider, name, None)
        assignments = list(scope[name.value]) if scope is not None else []
        for assignment in assignments:
            node = getattr(assignment, "node", None)
            statement = self.context.parent(node) if node is not None else None
            while statement is not None and not isinstance(statement, (cst.Assign, cst.BaseStatement)):
                statement = self.context.parent(statement)
            if isinstance(statement, cst.Assign) and any(
                (dotted(call.func) or "").rpartition(".")[2] in ("parse_args", "parse_known_args") for call in calls_in(statement.value)
            ):
                return True
        return False

    def _imported_module(self, receiver: cst.BaseExpression) -> bool:
        """`utils.cuda(inputs)` (robot-surgery-segmentation's helper that moves a tensor to the
        GPU): a function of a module bound by `import`, not a tensor's `.cuda(device)`."""
        while isinstance(receiver, cst.Attribute):
            receiver = receiver.value
        if not isinstance(receiver, cst.Name):
            return False
        scope = self.context.metadata.get_metadata(ScopeProvider, receiver, None)
        assignments = list(scope[receiver.value]) if scope is not None else []
        return bool(assignments) and all(isinstance(getattr(a, "node", None), cst.Import) for a in assignments)

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        kept: Block = []
        carried: list[cst.EmptyLine] = []  # comments of removed statements, for the next one
        for original, updated in block:
            if self._is_set_device(original):
                code = self.context.code(original.body[0])
                self.context.report(original, "DDP704", f"removed {code}: ddp_setup() sets this process's GPU")
                comment = f"# ddpify: removed {code}; ddp_setup() sets this process's GPU"
                carried += [*updated.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))]
                continue
            value = self._visible_devices_value(original)
            if value is None:
                if carried:
                    updated = updated.with_changes(leading_lines=[*carried, *updated.leading_lines])
                    carried = []
                kept.append((original, updated))
                continue
            carried += [*updated.leading_lines, *self._removal_comment(original, value)]
        if carried:
            # The removed statement ended the block: its comments need a statement to sit on,
            # and an emptied block needs a body.
            kept.append((None, cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)))
        return kept

    def _is_set_device(self, statement: cst.BaseStatement | None) -> bool:
        """``torch.cuda.set_device(...)`` alone on its line."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        return (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and "torch.cuda.set_device" in self.context.qualified(small.value.func)
        )

    def _flag_for(self, expression: str) -> str | None:
        """`opts.gpu_id` -> `--gpu_id` when the script declares that command-line flag."""
        name = expression.split(".")[-1]
        source = self.context.module.code
        for flag in (f"--{name}", f"--{name.replace('_', '-')}"):
            if f'"{flag}"' in source or f"'{flag}'" in source:
                return flag
        return None

    def _visible_devices_value(self, statement: cst.BaseStatement | None) -> tuple[str, bool] | None:
        """The value of an ``os.environ["CUDA_VISIBLE_DEVICES"] = ...`` statement and whether it
        is a literal, else None; also of an ``if`` that only sets it, on one line (DIP2021's
        ``if not args.use_avai_gpus: os.environ['CUDA_VISIBLE_DEVICES'] = args.gpu_devices``)."""
        if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.SimpleStatementSuite) \
                and len(statement.body.body) == 1:
            return self._visible_devices_value(cst.SimpleStatementLine(body=statement.body.body))
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Subscript) and "os.environ" in self.context.qualified(target.value):
                key = target.slice[0].slice if len(target.slice) == 1 else None
                if isinstance(key, cst.Index) and _literal(key.value) == "CUDA_VISIBLE_DEVICES":
                    return _value(small.value, self.context)
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            args = positional_args(small.value)
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "setdefault"
                and "os.environ" in self.context.qualified(func.value)
                and len(args) == 2
                and _literal(args[0].value) == "CUDA_VISIBLE_DEVICES"
            ):
                return _value(args[1].value, self.context)
        return None

    def _loaded_here(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call | None:
        """``torch.load(...)`` onto this process's device where it chooses none (DDP705)."""
        given = keyword_arg(original_node, "map_location")
        if given is not None and self._may_be_none(given.value, original_node):
            # (`map_location=None`, or a helper's `map_location=None` parameter handed on: cuda:0 on every rank)
            shown = self.context.code(given.value)
            self.context.report(original_node, "DDP705", "torch.load(..., map_location=ddp_map_location) where it was given "
                                f"none (`{shown}`): what was saved on a GPU onto this process's device, the CPU's kept there")
            chosen = "ddp_map_location" if shown == "None" else f"{shown} if {shown} is not None else ddp_map_location"
            args = [a.with_changes(value=cst.parse_expression(chosen)) if a.keyword and a.keyword.value == "map_location" else a for a in updated_node.args]
            return updated_node.with_changes(args=args)
        if given is not None:
            return None
        spread = next((i for i, arg in enumerate(updated_node.args) if arg.star == "**"), None)
        if spread is not None:  # (MGN's `torch.load(path, **kwargs)`, kwargs holding map_location on --cpu)
            self.context.report(original_node, "DDP705", "torch.load(..., map_location=ddp_map_location) unless the "
                                "call's own keywords choose one: what was saved on a GPU onto this process's device, the CPU's kept there")
            args = list(updated_node.args)
            spread_code = self.context.code(args[spread].value)
            args[spread] = args[spread].with_changes(value=cst.parse_expression(f'{{"map_location": ddp_map_location, **{spread_code}}}'))
            return updated_node.with_changes(args=args)
        if len(positional_args(original_node)) < 2:
            self.context.report(original_node, "DDP705", "torch.load(..., map_location=ddp_map_location): what was saved on a GPU onto this process's device, the CPU's kept there")
            return append_arg(updated_node, keyword("map_location", cst.parse_expression("ddp_map_location")))
        return None

    def _may_be_none(self, value: cst.BaseExpression, call: cst.Call) -> bool:
        """``None``, or a parameter of the function around ``call`` whose default is None."""
        if isinstance(value, cst.Name) and value.value == "None":
            return True
        node = enclosing_function(call, self.context.parent)
        if not isinstance(value, cst.Name) or node is None:
            return False
        params = [*node.params.params, *node.params.kwonly_params]
        return any(
            param.name.value == value.value and isinstance(param.default, cst.Name) and param.default.value == "None"
            for param in params
        )

    def _removal_comment(self, statement: cst.SimpleStatementLine, found: tuple[str, bool]) -> list[cst.EmptyLine]:
        value, literal = found
        value = " ".join(value.split())  # an expression over several lines, on one comment line
        if literal and "," not in value and value.strip():
            # One GPU pinned: DataParallel split nothing; the launch line (and plain `python`'s
            # relaunch) uses every GPU, the pin kept as the way back (Spk2ImgNet, batch 45)
            value = value.strip()
            how = f"the launch line uses every GPU; to train on that one alone as the original did: CUDA_VISIBLE_DEVICES={value} torchrun ..."
        elif literal:
            value = value.replace(" ", "")  # (ArcFace_pytorch's '0, 1': `CUDA_VISIBLE_DEVICES=0, 1 torchrun` runs `1`)
            self.context.visible_devices = value
            how = f"choose GPUs on the launch line: CUDA_VISIBLE_DEVICES={value} torchrun ..."
        else:
            # A Python expression (`opts.gpu_id`) never goes into the launch line: name its flag.
            flag = self._flag_for(value)
            gpus = f"the GPUs you pass with {flag}" if flag else f"the GPUs `{value}` named"
            how = f"set CUDA_VISIBLE_DEVICES to {gpus} on the launch line: CUDA_VISIBLE_DEVICES=... torchrun ..."
        self.context.report(statement, "DDP703", f"removed in-script CUDA_VISIBLE_DEVICES={value}; {how}")
        code = self.context.code(statement.with_changes(leading_lines=[])).strip()
        # a statement over several lines is commented out line by line
        removed = [f"# ddpify: removed {line}" if index == 0 else f"#   {line}" for index, line in enumerate(code.splitlines())]
        return [*(cst.EmptyLine(comment=cst.Comment(line.rstrip())) for line in removed), cst.EmptyLine(comment=cst.Comment(f"# {how}"))]


def _literal(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
        return node.evaluated_value
    return None


def _value(node: cst.BaseExpression, context) -> tuple[str, bool]:
    literal = _literal(node)
    return (literal, True) if literal is not None else (context.code(node), False)


def _is_module_call(func: cst.Attribute) -> bool:
    """``torch.cuda(...)`` is not a tensor's or a module's ``.cuda()``."""
    return isinstance(func.value, cst.Name) and func.value.value == "torch"
