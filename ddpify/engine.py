"""The conversion engine: libcst parse, analysis pass, transform pipeline.

A file flows: parse (once) -> analysis walk (``ddpify.analysis``: facts keyed by original
nodes) -> resolution under what the project says -> each transform's ``check()`` (any error
refuses the file) -> one traversal running every transform (``transforms/base.Pipeline``)
-> printed code with the helper block swapped in. ``FileConversion`` holds one file through
all of it; ``convert_text`` is the one-file use.

Kept apart from ``ddpify.api`` so that ``check`` and files with nothing to convert never
import libcst (a third of a second on its own).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace

import libcst as cst
from libcst.metadata import PositionProvider

from ddpify.after_rewrite import collective_for_rank_zero_alone, collective_never_reached, data_parallel_left, rewrite_does_not_compile
from ddpify.analysis import Analysis, Facts, activate, walk
from ddpify.analysis.step_functions import step_function_calls
from ddpify.diagnostics import ENTRY, LIBRARY, SCRIPT, ConvertOptions, Diagnostic, FileResult, ProjectLinks, Severity, suppressed
from ddpify.rules import RULES
from ddpify.transforms import ENTRY_TRANSFORMS, EXISTING_DDP, LIBRARY_SIDE_EFFECTS, OWN_DDP_PATH, REFERENCES_ONLY, TRANSFORMS
from ddpify.project.neighbours import (
    Neighbours,
    async_keywords_renamed,
    device_picked_elsewhere,
    named_elsewhere,
    imports_distributed_sampling,
    read_neighbours,
    wrapped_by_a_call,
    wrapped_elsewhere,
)
from ddpify.transforms.base import ConversionContext, MetadataView, Pipeline


def convert_text(
    source: str,
    options: ConvertOptions,
    path: str,
    role: str = SCRIPT,
    links: ProjectLinks | None = None,
) -> FileResult:
    """Parse, analyse and rewrite one file's text (see ddpify.api.convert_source). ``role``
    and ``links`` come from project mode (ddpify.project): the file's role (a library
    module, an entry script) and its links to the rest of the project."""
    file = FileConversion(path, source)
    learned = file.learn(links)
    if links is not None:
        learned.into(links)
    return file.rewrite(options, role, links)


@dataclass(frozen=True)
class Learned:
    """What a file's analysis tells the rest of a project (see ProjectLinks): plain data, so
    that it can come back from a worker process."""

    foreign_loaders: tuple[tuple[str, int | None], ...] = ()
    loader_parameters: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()
    sharded_parameter_calls: frozenset[str] = frozenset()

    def into(self, links: ProjectLinks) -> None:
        links.foreign_loaders.extend(ForeignCall(function, index) for function, index in self.foreign_loaders)
        links.loader_parameters.update((name, list(params)) for name, params in self.loader_parameters)
        links.sharded_parameter_calls.update(self.sharded_parameter_calls)


@dataclass(frozen=True)
class ForeignCall:
    """A loader this file trains on that a function of another module returns (its name
    here, and the element of the returned tuple; None: the value itself)."""

    function: str
    index: int | None


class FileConversion:
    """One file on the conversion path: parsed once, walked once (per set of names it binds
    from other modules: one in a project), resolved again only when the project learns more
    about it, rewritten once per role and links.

    ``convert_text`` is the one-file use; project mode (ddpify.project) keeps one per file and
    asks it what it learns (``learn``) while the project routes loaders between modules, and
    for the rewrite at the end.
    """

    def __init__(self, path: str, source: str) -> None:
        self.path, self.source = path, source
        self.failed: FileResult | None = None
        self._analysis: Analysis | None = None
        self._walked_for: tuple | None = None
        self._facts: Facts | None = None
        self._resolved_for: tuple | None = None
        self._rewrites: dict[tuple, FileResult] = {}
        self._neighbours: Neighbours | None = None
        self.original = source  # what the file holds (the source read may differ: `async=`, below)
        try:
            self.module = cst.parse_module(source)
        except cst.ParserSyntaxError as error:
            self.module = _without_async_keywords(source)
            if self.module is None:
                self.failed = _refused(path, source, [parse_error(source, error)])
                return
            self.source = source = self.module.code
        self.wrapper = cst.MetadataWrapper(self.module, unsafe_skip_copy=True)
        self.metadata = MetadataView(self.wrapper)
        self.step_calls = step_function_calls(self.module)  # this file's own step functions

    @property
    def neighbours(self) -> Neighbours:
        """Single-file mode: what the project modules this file imports do (read once)."""
        if self._neighbours is None:
            self._neighbours = read_neighbours(self.path, self.source)
        return self._neighbours

    def _dp_classes(self) -> dict:
        """The DataParallel subclasses of the project modules this file imports whose wraps
        convert (Wave-U-Net's `model_utils.DataParallel`, CPM's `BalancedDataParallel`), as
        bound here; read only for a file that calls a class named so."""
        if not re.search(r"\w*DataParallel\w*\(", self.source):  # (also `DataParallelWithCallback(`)
            return {}
        return self.neighbours.dp_classes

    def _single_file_links(self) -> ProjectLinks:
        """A file converted on its own: the training functions of the project modules it
        imports, read from disk, stand in for what project mode would link."""
        trainers = self.neighbours.trainers
        return ProjectLinks(
            # (`from utils import *` where utils imports SummaryWriter: PatchmatchNet)
            reexports=dict(self.neighbours.reexports),
            training_calls=frozenset(trainers),
            parameter_loaders={
                name: list(params)
                for name, params in [*trainers.items(), *self.neighbours.constructor_loaders.items()] if params
            },
        )

    def facts(self, links: ProjectLinks | None) -> Facts:
        """The facts under these links: walked on first use, resolved when they change."""
        project = links or self._single_file_links()
        names, reexports, training_calls, loader_functions, parameter_loaders_key, *_ = project.learning_key()
        training_calls = training_calls | self.step_calls
        walk = (names, reexports, training_calls)
        if walk != self._walked_for:
            self._analysis = Analysis(self.wrapper, project.names, project.reexports, training_calls, self._dp_classes())
            self._walked_for, self._resolved_for = walk, None
        parameter_loaders = project.parameter_loaders if links is not None or project.parameter_loaders else None
        resolution = (loader_functions, parameter_loaders_key, links is None, project.unfed, project.shared_builders)
        if resolution != self._resolved_for:
            self._facts = self._analysis.resolve(project.loader_functions, parameter_loaders, project.unfed, project.shared_builders)
            self._resolved_for = resolution
        activate(self._analysis.subtrees)
        return self._facts

    def learn(self, links: ProjectLinks | None) -> Learned:
        """Analyse under ``links``: what the rest of the project needs to know about this file."""
        if self.failed is not None:
            return Learned()
        facts = self.facts(links)
        return Learned(
            tuple((site.function, site.index) for site in facts.foreign_training_loaders),
            tuple((name, tuple(params)) for name, params in facts.loader_parameters.items()),
            frozenset(facts.sharded_parameter_calls),
        )

    def rewrite(self, options: ConvertOptions, role: str = SCRIPT, links: ProjectLinks | None = None) -> FileResult:
        """The converted file (or the refusal) for this role and these links; the same
        question twice gets the same answer without a second rewrite."""
        if self.failed is not None:
            return self.failed
        key = (options, role, links is not None and links.rewrite_key())
        if key not in self._rewrites:
            self._rewrites[key] = self._with_async_keywords_renamed(self._rewrite(options, role, links))
        return self._rewrites[key]

    def _with_async_keywords_renamed(self, result: FileResult) -> FileResult:
        """The result against the file as it is, where `async=` was read as `non_blocking=`:
        converted, the rename is part of the output (DDP015); refused or unchanged, the file
        is left as it was."""
        if self.original == self.source:
            return result
        if result.error or not result.changed:
            return replace(result, source=self.original, output=self.original)
        renamed = [
            Diagnostic(number, text.index("async") + 1, "DDP015", "`async=` (a keyword since Python 3.7) -> `non_blocking=`", Severity.CHANGE)
            for number, (text, read) in enumerate(zip(self.original.splitlines(), self.source.splitlines()), 1) if text != read
        ]
        return replace(result, source=self.original, diagnostics=tuple(sorted({*result.diagnostics, *renamed})))

    def _rewrite(self, options: ConvertOptions, role: str, links: ProjectLinks | None) -> FileResult:
        path, source, module = self.path, self.source, self.module
        facts = self.facts(links)
        project = links or ProjectLinks()
        if role == ENTRY and (facts.wraps or facts.existing_ddp):
            role = SCRIPT  # a project's entry script that wraps too: converted as a script
        if role == SCRIPT and not facts.wraps and not facts.dp_references and not facts.problems:
            refusal = variant_refusal(path, source, facts, self.metadata)
            # (ddim's main.py: `runner = Diffusion(args, config); runner.train()`, whose train() wraps)
            out_of_sight = links is None and wrapped_elsewhere(path, source)
            return refusal or out_of_sight or _unrecognised_wrap(path, source) or FileResult(path, source, source)
        if links is None and (facts.wraps or facts.dp_references):
            # (single-file mode: what the project modules it calls do with DataParallel)
            refusal = (
                wrapped_by_a_call(path, source, self.neighbours)
                or device_picked_elsewhere(path, source, self.neighbours)
                or (facts.wraps and named_elsewhere(path, source, self.neighbours))
            )
            if refusal:
                return refusal
        context = ConversionContext(
            module,
            facts,
            options,
            self.metadata,
            path=path,
            role=role,
            model_elsewhere=role != SCRIPT and not facts.wraps and facts.has_training_step and not project.models_unwrapped,
            trains_elsewhere=project.trains_elsewhere,
            # (a module that trains a model wrapped elsewhere reads the losses it calls too: hs-math-nlp's
            # model_process.py, its compute_performance summing in loss.py)
            neighbours=self.neighbours if links is None else self.neighbours.about_models()
            if facts.wraps or role == ENTRY or facts.has_training_step else Neighbours(),
        )
        for problem in facts.problems:
            context.report(problem.node, problem.code, problem.message, Severity.ERROR)
        if project.models_unwrapped and facts.has_training_step and facts.training_loops:
            context.report(
                facts.training_loops[0], "DDP215",
                "trains a model no DataParallel wrap of the project reaches (every wrap stays in the function that makes "
                "it): left as it is, as its original ran; under the launch line each process trains its own copy",
                Severity.WARNING,
            )
        transforms = [transform(context) for transform in _transforms_for(context)]
        for transform in transforms:
            transform.check()
        if context.has_errors:
            return _refused(path, source, context.diagnostics)
        converted = module.visit(Pipeline(context, transforms))
        if context.has_errors:  # found while rewriting (a name the new code needs, taken locally)
            return _refused(path, source, context.diagnostics)
        output = context.finish(converted.code)
        broken = (
            rewrite_does_not_compile(source, output) or collective_never_reached(source, output)
            or collective_for_rank_zero_alone(source, output)
        )
        if broken:
            context.report(module, "DDP002", broken, Severity.ERROR)
            return _refused(path, source, context.diagnostics)
        left = None if context.own_ddp_path else data_parallel_left(output)
        if left:  # (a wrap the analysis did not see as torch's: N DataParallel jobs under torchrun)
            context.report(module, "DDP003", left, Severity.ERROR)
            return _refused(path, source, context.diagnostics)
        launches = role == ENTRY or (role == SCRIPT and facts.wraps)
        return FileResult(
            path,
            source,
            output,
            tuple(sorted(set(context.diagnostics))),
            context.launch_command or (launch_command(path, context) if launches else None),
        )


def _transforms_for(context: ConversionContext) -> tuple:
    facts = context.facts
    if facts.existing_ddp and context.role == SCRIPT and facts.wraps:
        # a script with its own DDP path beside DataParallel takes that path, also when it
        # hands its loader to a project function (TransGAN: its DDP branch was switched off)
        if _own_path_unsharded(context):
            return TRANSFORMS
        context.own_ddp_path = True
        return OWN_DDP_PATH
    if context.model_elsewhere or facts.loader_functions or facts.sharded_parameter_calls or facts.loader_parameters:
        # trains a model wrapped elsewhere, builds or passes loaders trained on elsewhere
        return TRANSFORMS
    if context.role == ENTRY:
        return ENTRY_TRANSFORMS
    if context.role == LIBRARY and not facts.wraps:
        return LIBRARY_SIDE_EFFECTS
    # A module that only names the class (isinstance checks in a library) gets those names
    # rewritten and nothing else: set-up, samplers and guards belong to the script that wraps.
    return EXISTING_DDP if facts.existing_ddp else TRANSFORMS if facts.wraps else REFERENCES_ONLY


def _own_path_unsharded(context: ConversionContext) -> bool:
    """The script's own DDP path trains on loaders built here with no DistributedSampler
    anywhere (EfficientDet.Pytorch: every rank trained on all the data): that path is not
    taken; the DataParallel one is converted, and the report says so (DDP014)."""
    facts = context.facts
    if any(_samples(node) for node in walk(context.module)):
        return False
    # (qa-hard-em: a loader a project function builds with a RandomSampler, on every path)
    out_of_sight = any(isinstance(loop, cst.For) for loop in facts.training_loops) and not imports_distributed_sampling(context.path, context.module.code)
    if not (facts.fed_loops or _draws_from_a_loader_made_in_place(context) or out_of_sight):
        return False
    context.report(
        facts.distributed_uses[0],
        "DDP014",
        "the script's own DDP path shards no training data (no DistributedSampler: every rank would train on all of "
        "it): not taken; its DataParallel path is converted instead (launch without the script's own distributed "
        "switch)",
        Severity.WARNING,
    )
    return True


def _draws_from_a_loader_made_in_place(context: ConversionContext) -> bool:
    """A training loop over a DataLoader built in its own header (``for x, y in
    DataLoader(dataset, batch_size=8):``, pytorch-worker's shape): data of this file too."""
    return any(
        isinstance(node, cst.Call) and "torch.utils.data.DataLoader" in context.qualified(node.func)
        for loop in context.facts.training_loops if isinstance(loop, cst.For)
        for node in walk(loop.iter)
    )


def _samples(node: cst.CSTNode) -> bool:
    """A DistributedSampler named, or a sampler handed to a loader (its own path may shard)."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return (node.value if isinstance(node, cst.Name) else node.attr.value) == "DistributedSampler"
    return isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in ("sampler", "batch_sampler")


# check's forms of DataParallel that convert cannot rewrite: functional, forks, variants.
VARIANT_CODES = {"DDP120", "DDP121", "DDP122"}


def variant_refusal(path: str, source: str, facts: Facts, metadata: MetadataView) -> FileResult | None:
    """A file with no torch DataParallel to convert that still splits batches with a form of
    it (`DataParallelModel(net)` from a project's fork, mmcv's `MMDataParallel`): refused
    with check's finding (found by the analysis, ``facts.variants``), never "nothing to
    convert". A ``# noqa: DDP122`` on the line lets it through, as in ``ddpify check``."""
    lines = source.splitlines()
    errors = []
    for node, code in facts.variants:
        start = metadata.get_metadata(PositionProvider, node).start
        text = lines[start.line - 1] if start.line <= len(lines) else ""
        if not suppressed(text, code):
            message = f"{RULES[code].summary}; not converted"
            errors.append(Diagnostic(start.line, start.column + 1, code, message, Severity.ERROR))
    return _refused(path, source, errors) if errors else None


def _unrecognised_wrap(path: str, source: str) -> FileResult | None:
    """"Nothing to convert" said of a file that builds DataParallel in a form the analysis did
    not see as torch's: refused with the reason (DDP003), never passed as done."""
    left = data_parallel_left(source)
    return _refused(path, source, [Diagnostic(1, 1, "DDP003", left, Severity.ERROR)]) if left else None


def _refused(path: str, source: str, diagnostics: list[Diagnostic]) -> FileResult:
    errors = sorted({d for d in diagnostics if d.severity is Severity.ERROR})
    message = "; ".join(f"{d.line}:{d.col}: {d.code} {d.message}" for d in errors)
    return FileResult(path, source, source, tuple(errors), None, f"not converted: {message}")


def launch_command(path: str, context: ConversionContext) -> str:
    """`torchrun --standalone --nproc-per-node=N path`, N as many GPUs as DataParallel used."""
    counts = [site.device_count for site in context.facts.wraps if site.device_count]
    visible = context.visible_devices
    if counts:
        nproc = str(max(counts))
    elif visible and all(part.strip().isdigit() for part in visible.split(",")):
        nproc = str(len(visible.split(",")))
    else:
        nproc = "gpu"  # torchrun: one process per visible GPU, as DataParallel used them all
    prefix = f"CUDA_VISIBLE_DEVICES={shlex.quote(visible)} " if visible else ""
    return f"{prefix}torchrun --standalone --nproc-per-node={nproc} {path}"


def _without_async_keywords(source: str) -> cst.Module | None:
    """The module with ``async=`` read as ``non_blocking=`` (project/neighbours.py), or None
    if that is not what failed."""
    renamed = async_keywords_renamed(source)
    if renamed is None:
        return None
    try:
        return cst.parse_module(renamed)
    except cst.ParserSyntaxError:
        return None


def parse_error(source: str, error: cst.ParserSyntaxError) -> Diagnostic:
    """Python's own position and words where it has them (libcst's line can be one late)."""
    line, column, message = error.raw_line, error.raw_column + 1, error.message
    try:
        compile(source, "<converted>", "exec", dont_inherit=True)
    except SyntaxError as syntax:
        line, column, message = syntax.lineno or line, syntax.offset or column, syntax.msg or message
    except (ValueError, MemoryError):
        pass
    else:
        if "\t" in source:  # (improved-wgan-pytorch: Python reads it, libcst's tokenizer does not)
            message = (
                f"{message}: this file indents with tabs and spaces mixed, which Python accepts and the parser "
                "ddpify uses does not; expand its tabs (`expand -t 8 FILE`) and convert again"
            )
    text = source.splitlines()[line - 1] if 0 < line <= len(source.splitlines()) else ""
    if "async=" in text.replace(" ", ""):
        message += "; `async` is a keyword since Python 3.7: `.cuda(async=True)` is `.cuda(non_blocking=True)`"
    return Diagnostic(line, column, "DDP001", f"cannot parse: {message}", Severity.ERROR)
