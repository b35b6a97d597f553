"""The conversion engine: libcst parse, analysis pass, transform pipeline.

Kept apart from ``ddpify.api`` so that ``check`` and files with nothing to convert never
import libcst (a third of a second on its own).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from ddpify.analysis import Facts, analyze
from ddpify.diagnostics import ENTRY, LIBRARY, SCRIPT, ConvertOptions, Diagnostic, FileResult, ProjectLinks, Severity, suppressed
from ddpify.rules import RULES
from ddpify.transforms import ENTRY_TRANSFORMS, EXISTING_DDP, LIBRARY_SIDE_EFFECTS, REFERENCES_ONLY, TRANSFORMS
from ddpify.analysis.data_sites import step_function_calls
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
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return _refused(path, source, [_parse_error(source, error)])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    project = links or ProjectLinks()
    facts = analyze(
        wrapper,
        project.names,
        project.loader_functions,
        project.parameter_loaders if links is not None else None,
        project.reexports,
        project.training_calls | step_function_calls(module),
    )
    if role == ENTRY and (facts.wraps or facts.existing_ddp):
        role = SCRIPT  # a project's entry script that wraps too: converted as a script
    project.foreign_loaders.extend(facts.foreign_training_loaders)
    project.loader_parameters.update(facts.loader_parameters)
    project.sharded_parameter_calls.update(facts.sharded_parameter_calls)
    metadata = MetadataView(wrapper)
    if role == SCRIPT and not facts.wraps and not facts.dp_references and not facts.problems:
        return variant_refusal(path, source, facts, metadata) or FileResult(path, source, source)
    context = ConversionContext(
        module,
        facts,
        options,
        metadata,
        path=path,
        role=role,
        model_elsewhere=role != SCRIPT and not facts.wraps and facts.has_training_step,
        trains_elsewhere=project.trains_elsewhere,
    )
    for problem in facts.problems:
        context.report(problem.node, problem.code, problem.message, Severity.ERROR)
    transforms = [transform(context) for transform in _transforms_for(context)]
    for transform in transforms:
        transform.check()
    if context.has_errors:
        return _refused(path, source, context.diagnostics)
    converted = module.visit(Pipeline(context, transforms))
    if context.has_errors:  # found while rewriting (a name the new code needs, taken locally)
        return _refused(path, source, context.diagnostics)
    launches = role == ENTRY or (role == SCRIPT and facts.wraps)
    return FileResult(
        path,
        source,
        context.finish(converted.code),
        tuple(sorted(set(context.diagnostics))),
        context.launch_command or (launch_command(path, context) if launches else None),
    )


def _transforms_for(context: ConversionContext) -> tuple:
    facts = context.facts
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
    prefix = f"CUDA_VISIBLE_DEVICES={visible} " if visible else ""
    return f"{prefix}torchrun --standalone --nproc-per-node={nproc} {path}"


def _parse_error(source: str, error: cst.ParserSyntaxError) -> Diagnostic:
    """Python's own position and words where it has them (libcst's line can be one late)."""
    line, column, message = error.raw_line, error.raw_column + 1, error.message
    try:
        compile(source, "<converted>", "exec", dont_inherit=True)
    except SyntaxError as syntax:
        line, column, message = syntax.lineno or line, syntax.offset or column, syntax.msg or message
    except (ValueError, MemoryError):
        pass
    text = source.splitlines()[line - 1] if 0 < line <= len(source.splitlines()) else ""
    if "async=" in text.replace(" ", ""):
        message += "; `async` is a keyword since Python 3.7: `.cuda(async=True)` is `.cuda(non_blocking=True)`"
    return Diagnostic(line, column, "DDP001", f"cannot parse: {message}", Severity.ERROR)
