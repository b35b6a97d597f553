"""The analysis pass: facts about a script that the transforms act on.

One visitor (``visitor.Analyzer``) walks the original tree once and hands each node to the
rooms below; after the walk each room resolves what it recorded. They share one ``Facts``
(``facts.py``), keyed by original nodes, and one ``Scopes`` (where the walk is, metadata).

- ``wraps.py`` (wraps and models): every DataParallel wrap site (with a chained
  ``.to(...)``/``.cuda()`` and any enclosing ``if``), other references to the class,
  subclasses, forms that cannot be converted, DDP code already there, GPU-count names;
- ``loaders.py`` (loaders): every DataLoader, and which of them an expression stands for,
  traced through variables, ``self.`` attributes, parameters, builders' returned tuples and
  (project mode) other modules' functions;
- ``loops.py`` (loops and training steps): the loops that train (call ``backward()`` or
  ``step()``), the loaders that feed them (sharded), the epoch loops around them (for
  ``set_epoch``), passes over a training loader that do not train;
- ``ranks.py`` (ranks, guards, collectives): conditions that are the same on every rank,
  and the functions that call a model or a collective, so that rank-0 guards never wrap
  them (that would hang the other ranks);
- ``entry.py`` (the entry point): the ``if __name__ == "__main__":`` block, whether module
  level code runs, and where the process-group set-up must go;
- ``scopes.py`` and ``calls.py`` (names and scopes): qualified names, assignments, who calls
  a function of the file and with what;
- ``tree.py``: shared helpers over libcst nodes (``walk``, ``dotted``, ``calls_in``, ...).

Transforms read these facts; they never re-derive them.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.entry import CONFIGURATION_CALLS
from ddpify.analysis.facts import (
    Context,
    EpochHook,
    Facts,
    ForeignLoader,
    Function,
    Guard,
    LoaderSite,
    Loop,
    Problem,
    WrapSite,
)
from ddpify.analysis.loaders import ITERABLE_WRAPPERS
from ddpify.analysis.loops import NOT_A_PASS, TRAINING_WORDS, reads_data
from ddpify.analysis.ranks import (
    HARMLESS_METHODS,
    UNIFORM_CALLS,
    in_data_loading,
    loop_names_around,
    same_on_every_rank,
    same_path_on_every_rank,
    under_rank_guard,
)
from ddpify.analysis.scopes import PROVIDERS, STAR_IMPORTED_ROOTS, star_imported_torch, star_roots
from ddpify.analysis.tree import (
    COLLECTIVE_METHODS,
    DEVICE_COUNT,
    SCHEDULER_WORDS,
    TRAINING_METHODS,
    Subtrees,
    activate,
    backwards_per_pass,
    batch_length,
    bound_names,
    calls_in,
    dotted,
    enclosing_function,
    argument_in_slot,
    first_positional,
    innermost_loop,
    is_backward,
    is_main_guard,
    is_training_call,
    names_in,
    root_name,
    walk,
    without_gradients,
)
from ddpify.analysis.visitor import Analyzer
from ddpify.analysis.wraps import ALREADY_DISTRIBUTED, DATA_PARALLEL_INTERNALS, FORWARDING_METHODS, subclass_blocker

# The names these helpers had when the analysis was one module (ddpify/analysis.py).
_is_training_call, _is_backward, _root_name, _reads_data = is_training_call, is_backward, root_name, reads_data
_backwards_per_pass, _subclass_blocker = backwards_per_pass, subclass_blocker

__all__ = [
    "ALREADY_DISTRIBUTED", "Analysis", "Analyzer", "COLLECTIVE_METHODS", "CONFIGURATION_CALLS", "Context", "DATA_PARALLEL_INTERNALS",
    "DEVICE_COUNT", "EpochHook", "FORWARDING_METHODS", "Facts", "ForeignLoader", "Function", "Guard", "HARMLESS_METHODS",
    "ITERABLE_WRAPPERS", "LoaderSite", "Loop", "NOT_A_PASS", "Problem", "SCHEDULER_WORDS", "STAR_IMPORTED_ROOTS",
    "TRAINING_METHODS", "TRAINING_WORDS", "UNIFORM_CALLS", "WrapSite", "analyze", "batch_length", "bound_names",
    "argument_in_slot", "calls_in", "dotted", "enclosing_function", "first_positional", "innermost_loop", "is_main_guard", "loop_names_around", "names_in", "same_on_every_rank",
    "same_path_on_every_rank", "star_imported_torch", "star_roots", "under_rank_guard", "walk", "without_gradients", "in_data_loading",
]


class Analysis:
    """One file's analysis: walked once; resolved again for each thing the project tells it.

    ``project_names``, ``reexports`` and ``training_calls`` (project mode: the names the
    module binds from other project modules, the library names they pass on, the calls of
    their functions that train) and ``dp_classes`` (the DataParallel subclasses of project
    modules whose wraps convert, as bound here) shape the walk; ``resolve`` takes what may change while a
    project is converted: ``loader_functions`` (this module's functions whose returned
    loaders another module trains on) and ``parameter_loaders`` (None: a file on its own).
    """

    def __init__(
        self,
        wrapper: cst.MetadataWrapper,
        project_names: frozenset[str] = frozenset(),
        reexports: dict[str, str] | None = None,
        training_calls: frozenset[str] = frozenset(),
        dp_classes: dict | None = None,
    ) -> None:
        self.subtrees = Subtrees()
        activate(self.subtrees)  # filled by the analyzer's walk
        walked = Facts(project_names=project_names, reexports=dict(reexports or {}), training_calls=training_calls)
        walked.dp_classes.update(dp_classes or {})  # the project's DataParallel subclasses that convert
        # Resolved once and kept readable after the walk: transforms ask the analyzer whether
        # a call reaches the model.
        self.analyzer = Analyzer(walked, wrapper.resolve_many(PROVIDERS), self.subtrees)
        wrapper.module.visit(self.analyzer)
        self.walked = walked

    def resolve(
        self,
        loader_functions: dict[str, set[int | None]] | None = None,
        parameter_loaders: dict[str, list[tuple[int, str]]] | None = None,
        unfed: frozenset[str] = frozenset(),
        shared_builders: frozenset[str] = frozenset(),
    ) -> Facts:
        """The facts, decided on a copy of the walk's (the last one is the analyzer's)."""
        activate(self.subtrees)
        facts = self.walked.copy()
        facts.loader_functions = dict(loader_functions or {})
        facts.parameter_loaders = parameter_loaders
        facts.unfed = unfed
        facts.shared_builders = shared_builders
        self.analyzer.resolve(facts)
        facts.analyzer = self.analyzer
        return facts


def analyze(
    wrapper: cst.MetadataWrapper,
    project_names: frozenset[str] = frozenset(),
    loader_functions: dict[str, set[int | None]] | None = None,
    parameter_loaders: dict[str, list[tuple[int, str]]] | None = None,
    reexports: dict[str, str] | None = None,
    training_calls: frozenset[str] = frozenset(),
) -> Facts:
    """Walk and resolve one file (see ``Analysis``)."""
    return Analysis(wrapper, project_names, reexports, training_calls).resolve(loader_functions, parameter_loaders)
