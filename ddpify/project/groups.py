"""Converting a project: each entry script and the modules it imports, as a group.

For every script that runs (``Project.candidates``) the group is the script and the project
modules it imports. Each member gets a role (``ddpify.project``), is analysed, and says what
it learnt: loaders it trains on that another module's function returns, functions that
train on a loader parameter. The group then routes that knowledge (the builder of a loader
shards it, the caller of a trainer shards what it passes), files are analysed again with
it, and only then rewritten: once each, in the workers together. A module that several
entry scripts import is planned by the first group; later groups reuse it, and add only
what they need from it (another loader its builder must shard).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpify.diagnostics import ENTRY, LIBRARY, SCRIPT, ConvertOptions, Diagnostic, FileResult, ProjectLinks, Severity
from ddpify.project.graph import BACKWARD, CALL_NAME, SIDE_EFFECT_WORDS, ModuleInfo, Project
from ddpify.project.verdicts import (
    _evaluates_only,
    _leave_all_if_refused,
    _leave_unreached_copy,
    _leave_unused_subclasses,
    _left_for_evaluation,
    _refusal,
    unreadable_result,
    _refusal,
    _refuse_together,
    leave_what_no_training_reaches,
    _wraps,
)
from ddpify.workers import open_files


@dataclass(eq=False)
class Pending:
    """A file routed but not rewritten yet: the rewrite runs once the groups are routed (with
    the other files, in the workers), then ``patches`` (refusals and warnings the routing
    found) apply to its result, in order."""

    path: Path
    role: str
    links: ProjectLinks  # what the rewrite depends on, as it was when the file was planned
    patches: list = field(default_factory=list)
    result: FileResult | None = None  # the rewrite, patched


# In a group's plan: a module an earlier group converted; its result, whatever it is when
# this group is decided.
REUSED = "reused"


@dataclass
class GroupPlan:
    """A group routed: what each member became (Pending, a result, or REUSED), and the
    roles and links it was planned with. Decided once its files are rewritten."""

    entry: ModuleInfo
    members: list[ModuleInfo]
    trains: bool
    converted: dict
    roles: dict[Path, str]
    links: dict[Path, ProjectLinks]
    claimed: set[Path]  # files this group converts that no earlier group did

    def pending(self) -> list[Pending]:
        return [item for item in self.converted.values() if isinstance(item, Pending)]


def _patch(item: FileResult | Pending, change) -> FileResult | Pending:
    """Apply ``change`` (FileResult -> FileResult) now, or after the rewrite of a pending file."""
    if isinstance(item, Pending):
        item.patches.append(change)
        return item
    return change(item)


def convert_project(root: Path, sources: dict[Path, str], options: ConvertOptions, jobs: int = 0) -> list[FileResult]:
    """Convert every file of the project; results in the order of ``sources``. ``jobs``:
    worker processes (0: one per CPU, where the project is large enough to pay for them)."""
    project = Project(root, sources)
    # ddpify's own output (converted earlier): nothing to convert, as for a single file
    results: dict[Path, FileResult] = {
        path: FileResult(str(path), source, source) for path, source in sources.items() if ALREADY_CONVERTED.search(source)
    }
    # Worker processes (if the project is large enough) start now: they import libcst while
    # this process reads the import graph.
    files = open_files(list(sources), jobs)
    try:
        candidates = project.candidates()
        apart = _unreadable_alone(project, candidates)
        if _unreadable_first(candidates, results, root, options, apart):
            return [results.get(path) or FileResult(str(path), source, source) for path, source in sources.items()]
        run = ProjectConversion(project, options, results)
        run.files = files
        run.load(run.likely_conversions(candidates))
        groups = run.convert_groups([entry for entry in candidates if entry.runs])
        leave_what_no_training_reaches(project, results)
        while any(_refuse_together(group, results, root) for group in groups):
            pass  # a module shared by two groups, refused in one: the other goes too
        for info in candidates:  # a DataParallel module no script of the project imports
            if info.path not in results and (_wraps_to_evaluate(project, info) or run.evaluated_only(info)):
                # (Wave-U-Net's cog_predict.py: a predictor class a serving tool runs) evaluates
                # with the project's models as one process, as a script that only evaluates
                results[info.path] = _left_for_evaluation(info)
            elif info.path not in results and info.wraps:
                alone = run.plan(info, SCRIPT, ProjectLinks())
                run.rewrite([alone])
                converted = {info.path: alone.result}
                _leave_unused_subclasses([info], None, converted)  # a vendored subclass nothing imports
                if any(entry.runs for entry in candidates):  # (beside scripts; a folder of no script at all refuses it)
                    _leave_unreached_copy(info, converted, project.sources)
                results[info.path] = converted[info.path]
    finally:
        files.close()
    leave_what_no_training_reaches(project, results)  # (and the modules refused alone since)
    if not options.allow_partial:
        _leave_all_if_refused(results, root, apart)
    return [_said_in_folder_mode(results.get(path) or FileResult(str(path), source, source)) for path, source in sources.items()]


FOLDER_ADVICE = "ddpify convert DIR"


def _said_in_folder_mode(result: FileResult) -> FileResult:
    """Single-file advice ("convert the folder that holds both") said of a file in folder mode
    points nowhere (reid, the speech-enhancement trainer): it says what folder mode could not follow."""
    if not any(FOLDER_ADVICE in d.message for d in result.diagnostics):
        return result
    note = (
        " (this is folder mode already: the module that does it is outside this folder, or reached in a way "
        "ddpify does not follow, such as importlib with a name read from a configuration or a path added at run time)"
    )
    alone = (
        "no entry point (module-level code or an `if __name__ == \"__main__\":` block), and no script of this folder "
        "imports it in a way ddpify follows (importlib with a name read from a configuration is not): import it by "
        "name from the script you launch and convert the folder again"
    )
    diagnostics = tuple(
        replace(d, message=alone if d.code == "DDP202" else d.message + note) if FOLDER_ADVICE in d.message else d
        for d in result.diagnostics
    )
    return replace(result, diagnostics=diagnostics)


def _unreadable_first(
    candidates: list[ModuleInfo], results: dict[Path, FileResult], root: Path, options: ConvertOptions, apart: set[Path]
) -> bool:
    """A script or DataParallel module Python cannot read (a merge-conflict marker, Python 2)
    is refused with its parse error, never judged to train nothing. It holds the project's
    DataParallel files back (what it takes from them cannot be known; unless partial output is
    allowed), but not beside a readable script that trains: it cannot run as it is, so what
    is converted for that script cannot break it (DTDN's `baseline_office.py`, a copy with
    merge-conflict markers nothing imports, refused `baseline.py`'s conversion: batch 44).
    True if that settled the project. ``apart``: those refused on their own (_unreadable_alone)."""
    unreadable = [info for info in candidates if not info.parses and (info.wraps or info.trains) and info.path not in results]
    for info in unreadable:
        results[info.path] = unreadable_result(info)
    unreadable = [info for info in unreadable if info.path not in apart]
    if not unreadable or options.allow_partial:
        return False
    name = unreadable[0].path.relative_to(root) if unreadable[0].path.is_relative_to(root) else unreadable[0].path
    reason = f"{name} does not parse, so what it takes from this file cannot be known, and a project converts whole or not at all"
    for info in candidates:
        if info.path not in results and info.wraps:
            results[info.path] = _refusal(FileResult(str(info.path), info.source, info.source), "DDP210", reason)
    return True


def _unreadable_alone(project: Project, candidates: list[ModuleInfo]) -> set[Path]:
    """The unreadable files that no module of the project imports (by name, or by a computed
    name), when a readable script of the project trains: they are refused on their own."""
    trained = any(
        info.parses and info.runs and (info.trains or any(module.trains for module in project.reachable(info)))
        for info in candidates
    )
    if not trained:
        return set()
    imported = {name for info in project.modules_by_path().values() for name in info.imports}
    return {info.path for info in candidates if not info.parses and info.name not in imported}


class ProjectConversion:
    """One run of project mode: the files (each parsed, analysed and rewritten once, in
    ``files``), the results so far, and the role and links each kept group planned its
    modules with (a later group that imports one reuses it)."""

    def __init__(self, project: Project, options: ConvertOptions, results: dict[Path, FileResult]) -> None:
        self.project, self.options, self.results = project, options, results
        self.files = None  # ddpify.workers: set by convert_project
        self.planned: dict[Path, tuple[str, ProjectLinks]] = {}
        self.claimed: set[Path] = set(results)  # files converted (or left) before the group being planned
        self._evaluation: dict[Path, bool] = {}
        self._learned: dict[tuple, object] = {}  # (path, links it learnt under) -> engine.Learned

    def links(self, member: ModuleInfo, members: list[ModuleInfo]) -> ProjectLinks:
        return ProjectLinks(
            names=self.project.project_names(member),
            reexports=self.project.reexports(member),
            training_calls=self.project.training_calls(member),
            trains_elsewhere=any(other.trains for other in members if other is not member),
            shared_builders=self.project.shared_builders(member),
            models_unwrapped=member.trains and not WRAP_CALL.search(member.source) and all(map(_wraps_stay_inside, members)),
        )

    def _members(self, entry: ModuleInfo) -> list[ModuleInfo] | None:
        """The group of an entry script; None if it has nothing to convert, or only
        evaluates (see convert_group)."""
        members = [entry, *self.project.reachable(entry)]
        if not any(member.wraps for member in members):
            return None
        if entry.path not in self._evaluation:
            trains = any(BACKWARD.search(member.source) for member in members)
            # (AttGAN's test.py builds the project's model, whose constructor wraps it, and calls
            # none of its training methods: it evaluates)
            self._evaluation[entry.path] = len(members) > 1 and (
                not trains or _evaluates_only(self.project, entry, members)
                # (or an object of a project class that trains when called: `trainer(model, epoch)`)
                or not _reaches_training(entry, members) and not self.project.training_calls(entry)
            )
        return [] if self._evaluation[entry.path] else members

    def evaluated_only(self, info: ModuleInfo) -> bool:
        """A module that wraps a model for scripts that only evaluate (reid-strong-baseline's
        engine/inference.py, its ignite evaluator wrapping the model, for tools/test.py), with no
        backward() of its own, that no training group took: it stays as it is, as they do (not
        a script of its own: it has no entry point to set anything up from)."""
        if not info.wraps or BACKWARD.search(info.source):
            return False
        return any(
            self._evaluation.get(entry.path) and info.path in {member.path for member in self.project.reachable(entry)}
            for entry in self.project.candidates() if entry.runs
        )

    def _trains_as_an_entry(self, member: ModuleInfo) -> bool:
        """A script another entry imports (DrugEx's generate.py imports train.py for its loader
        builder) that trains as an entry of its own: it is converted in that role, with its
        set-up, whichever group reaches it first (never as the other's library: the verdict
        would hang on the order of the files' names)."""
        # (its own group need not wrap: pva-faster-rcnn's pytorch_train.py, a script of its own that a
        # configuration module's computed import reaches, trains at its top level: batch 46)
        members = [member, *self.project.reachable(member)]
        return _reaches_training(member, members, _entry_code(member.source))

    def likely_conversions(self, candidates: list[ModuleInfo]) -> list[tuple[ModuleInfo, ProjectLinks]]:
        """The files the groups will analyse (read from the import graph alone), with the links
        they will first be analysed under: parsed and walked ahead, in parallel. A file the
        routing needs later (a loader builder with nothing else to convert) loads then."""
        found: dict[Path, tuple[ModuleInfo, ProjectLinks]] = {}
        for entry in candidates:
            members = self._members(entry) if entry.runs else None
            for member in members or ():
                if member.path in self.results or member.path in found:
                    continue
                library = not member.runs or not (member.wraps or member.trains)
                if member is entry or (library and (member.wraps or member.trains or _has_side_effects(member.source))):
                    found[member.path] = (member, self.links(member, members))
        for info in candidates:  # converted alone if no group takes it
            if info.wraps and info.path not in found and info.path not in self.results:
                found[info.path] = (info, ProjectLinks())
        return list(found.values())

    def load(self, likely: list[tuple[ModuleInfo, ProjectLinks]]) -> None:
        """Parse and walk ahead (in parallel in the workers); what each file learns under its
        first links is kept, so that its first plan asks nothing more of the worker."""
        learned = self.files.load([(str(info.path), info.source, links) for info, links in likely])
        for (info, links), answer in zip(likely, learned):
            self._learned[(info.path, links.learning_key())] = answer

    def plan(self, info: ModuleInfo, role: str, links: ProjectLinks) -> Pending:
        """Analyse one file of a group under ``links``; what it learns lands in them (cleared
        first: a file may be planned again with more knowledge). Rewritten later, once."""
        links.foreign_loaders.clear()
        links.loader_parameters.clear()
        links.sharded_parameter_calls.clear()
        key = (info.path, links.learning_key())
        if key not in self._learned:
            self._learned[key] = self.files.learn(str(info.path), info.source, links)
        self._learned[key].into(links)
        inputs = replace(
            links,
            reexports=dict(links.reexports),
            loader_functions=None if links.loader_functions is None else dict(links.loader_functions),
            parameter_loaders=dict(links.parameter_loaders),
            foreign_loaders=[],
            loader_parameters={},
            sharded_parameter_calls=set(),
        )
        return Pending(info.path, role, inputs)

    def rewrite(self, pending: list[Pending]) -> None:
        """Rewrite these files (together, in the workers), each into its ``result`` with its
        patches applied."""
        rewritten = self.files.rewrite([(str(item.path), self.options, item.role, item.links) for item in pending])
        for item, result in zip(pending, rewritten):
            for change in item.patches:
                result = change(result)
            item.result = result

    def convert_groups(self, entries: list[ModuleInfo]) -> list[list[Path]]:
        """Every entry script's group: all routed first, then every file rewritten at once,
        then each group decided in order. Routing a group only needs to know which files the
        groups before it converted; only a group that turns out to name DataParallel without
        wrapping (its files then free for later groups) makes that unknowable in advance:
        the groups are then converted one after the other (the files' analyses and rewrites
        kept: nothing is parsed again)."""
        results, planned = dict(self.results), dict(self.planned)
        plans = [plan for entry in entries if (plan := self.plan_group(entry)) is not None]
        self.rewrite([item for plan in plans for item in plan.pending()])
        groups = []
        for plan in plans:
            group = self.decide_group(plan)
            if group is None:
                self.results.clear()
                self.results.update(results)
                self.planned, self.claimed = planned, set(results)
                return self._one_after_the_other(entries)
            groups.append(group)
        return groups

    def _one_after_the_other(self, entries: list[ModuleInfo]) -> list[list[Path]]:
        groups = []
        for entry in entries:
            plan = self.plan_group(entry)
            if plan is None:
                continue
            self.rewrite(plan.pending())
            group = self.decide_group(plan)
            if group is None:  # not a DataParallel group: its files stay free
                self.claimed -= plan.claimed
                for path in plan.claimed:
                    self.planned.pop(path, None)
                continue
            groups.append(group)
        return groups

    def plan_group(self, entry: ModuleInfo) -> GroupPlan | None:
        """The entry script and the project modules it imports, routed: each gets a role and
        is analysed, loaders are routed to the modules that build or pass them. None: the
        group has nothing to convert."""
        project, options, results = self.project, self.options, self.results
        members = self._members(entry)
        if members is None:
            return None
        if entry.path in self.claimed and entry.path in self.planned and not self._trains_as_an_entry(entry):
            return None  # an earlier script's library, whose own `__main__` block trains nothing
        if not members:
            # Evaluates or exports with the project's models: nothing to shard or synchronise.
            # It stays as it is (modules converted for a training script allow a process that
            # set up no group). A script on its own converts as it would alone.
            results.setdefault(entry.path, _left_for_evaluation(entry))
            self.claimed.add(entry.path)
            return None
        trains = any(BACKWARD.search(member.source) for member in members)
        converted: dict[Path, FileResult | Pending | str] = {}
        roles: dict[Path, str] = {}
        links: dict[Path, ProjectLinks] = {}
        shared: dict[Path, ProjectLinks] = {}  # modules an earlier group planned: what they learnt
        for member in members:
            if member.path in self.claimed:
                converted[member.path] = REUSED
                if member.path in self.planned:
                    shared[member.path] = self.planned[member.path][1]
                continue
            links[member.path] = self.links(member, members)
            if member is entry:
                roles[member.path] = ENTRY  # the engine makes it a script if it wraps
            elif not member.runs or not self._trains_as_an_entry(member):
                # A helper with a self-test `__main__` block is still this script's library, as is
                # one whose functions train and wrap while its own `__main__` block trains nothing.
                roles[member.path] = LIBRARY
            else:
                continue  # another script: its own group
            if member is entry or member.wraps or member.trains or _has_side_effects(member.source):
                converted[member.path] = self.plan(member, roles[member.path], links[member.path])
        modules = project.modules_by_path()
        # A loop over a loader parameter (`train_one_epoch(model, loader)` in engine.py): the
        # callers shard what they pass.
        for path in _route_parameters(project, members, links, converted, shared, roles):
            converted[path] = self.plan(modules[path], roles[path], links[path])
        # A loader another module's builder returns: that module shards it where it builds it.
        builders: dict[Path, dict[str, set[int | None]]] = {}  # module -> its loader functions to shard
        for path, link in links.items():
            for foreign in link.foreign_loaders:
                _route(project, modules[path], foreign, builders, converted, options)
        for path, functions in builders.items():
            if path in links:
                links[path].loader_functions = functions
                converted[path] = self.plan(modules[path], roles.get(path, LIBRARY), links[path])
            elif path in self.planned:
                # A builder an earlier group converted (two training scripts, one data module):
                # the same file serves both, sharding what either trains on.
                role, before = self.planned[path]
                merged = {name: set(indices) for name, indices in (before.loader_functions or {}).items()}
                for name, indices in functions.items():
                    merged.setdefault(name, set()).update(indices)
                if merged != (before.loader_functions or {}):
                    links[path] = replace(
                        before, loader_functions=merged, foreign_loaders=[], loader_parameters={}, sharded_parameter_calls=set()
                    )
                    roles[path] = role
                    converted[path] = self.plan(modules[path], role, links[path])
        claimed = {path for path in converted if path not in self.claimed}
        self.claimed |= claimed
        self.planned.update((path, (roles[path], links[path])) for path in links if path in roles and path in converted)
        return GroupPlan(entry, members, trains, converted, roles, links, claimed)

    def decide_group(self, plan: GroupPlan) -> list[Path] | None:
        """The group as a whole, once its files are rewritten: a DataParallel group (None if
        it only names the class), with a sharded training loader and a set-up in its entry
        script (else refused). Its results go into ``results``; returns its files."""
        options, entry = self.options, plan.entry
        converted = {
            path: self.results[path] if item is REUSED else item.result if isinstance(item, Pending) else item
            for path, item in plan.converted.items()
        }
        _leave_unused_subclasses(plan.members, entry, converted)
        if not any(_wraps(result) for result in converted.values()):
            return None  # DataParallel only named (isinstance checks): not a DataParallel project
        entry_result = converted[entry.path]
        if plan.trains and not any(result.error for result in converted.values()) and not any(
            _shards(result) for result in converted.values()
        ):
            reason = (
                "the project's model is wrapped in DistributedDataParallel, but no training DataLoader was found "
                "sharded in this script or the modules it imports (built in a class, loaded dynamically, or in a "
                "module ddpify cannot follow): every rank would train on all the data"
            )
            if not any("DataLoader" in member.source for member in plan.members):
                # (wolpertinger_ddpg: batches sampled from a replay buffer the agent fills from its own rollouts)
                reason = (
                    "the project's model is wrapped in DistributedDataParallel, but no DataLoader appears in this script "
                    "or the modules it imports: its batches are made in the process (a replay buffer, environment "
                    "rollouts, a get_batch() of the project), which ddpify cannot split between the ranks, and every "
                    "rank would train on all of them; give each rank its share by hand (every rank's data made alike, "
                    "each sampled batch sliced by rank), or make the data a Dataset in a DataLoader"
                )
            if options.allow_partial:
                warning = Diagnostic(1, 1, "DDP211", f"{reason} (converted anyway: --allow-partial)", Severity.WARNING)
                converted[entry.path] = replace(entry_result, diagnostics=(*entry_result.diagnostics, warning))
            else:
                converted[entry.path] = _refusal(entry_result, "DDP211", reason)
        elif not entry_result.error and "ddp_setup()" not in entry_result.output:
            # Modules converted under a script that sets nothing up would fail at their first
            # collective: refuse the entry, and so the group.
            reason = "this script runs project modules that use DistributedDataParallel, but it could not be given the set-up"
            converted[entry.path] = _refusal(entry_result, "DDP210", reason)
        self.results.update(converted)
        return list(converted)


ALREADY_CONVERTED = re.compile(r"^# Distributed (set-up|helpers) added by ddpify", re.MULTILINE)


def _reaches_training(entry: ModuleInfo, members: list[ModuleInfo], runs: str | None = None) -> bool:
    """Does the entry train itself, or call a function or method of its modules that trains
    (by name: `attgan.trainG(...)`, `train(...)`)? A `.train()` of the model counts too.
    ``runs``: only this code of the entry runs when it is launched (its `__main__` block and
    top-level statements), the functions of its own module count like the others'."""
    if runs is None and (BACKWARD.search(entry.source) or entry.wraps):
        return True
    if runs is not None and BACKWARD.search(runs):
        return True
    own = runs is not None
    names = {name.rpartition(".")[2] for member in members if own or member is not entry for name in member.training_defs}
    # (and what calls those, in their modules: the trainer's fit() runs its train_epoch())
    for member in members:
        if member is entry and not own:
            continue
        grown = True
        while grown:
            grown = False
            for name, words in member.def_words.items():
                if name not in names and words & names:
                    names.add(name)
                    grown = True
    if runs is not None:  # (named at all: `fire.Fire(main)`, `mp.spawn(main_worker, ...)` run it too)
        return any(re.search(rf"\b{re.escape(name)}\b", runs) for name in names)
    return any(re.search(rf"\b{re.escape(name)}\s*\(", entry.source) for name in names)


def _entry_code(source: str) -> str:
    """What runs when the module is launched: its top-level statements but definitions and
    imports (pytorch-unet-segmentation's modules.py, main.py's library, whose `__main__` block
    only measures a loss: batch 44)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    kept = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return "\n".join(ast.get_source_segment(source, node) or "" for node in tree.body if not isinstance(node, kept))


def _route_parameters(
    project: Project, members: list[ModuleInfo], links: dict, converted: dict, shared: dict, roles: dict
) -> list[Path]:
    """Functions that train on a loader parameter (learnt in the first pass) and the group
    modules that call them: each caller gets the calls to look at (``parameter_loaders``);
    returns the callers to convert again. A function no caller feeds is refused (DDP309).
    Those of ``shared`` modules (planned by an earlier group, fed there) are called, not
    refused, here."""
    trainers = {
        (project.modules_by_path()[path].name, function): params
        for path, link in links.items()
        for function, params in link.loader_parameters.items()
    }
    known = {
        (project.modules_by_path()[path].name, function): params
        for path, link in shared.items()
        for function, params in link.loader_parameters.items()
    } | trainers
    if not known:
        return []
    callers, fed = [], set()
    for member in members:
        calls = {}
        for name in set(CALL_NAME.findall(member.source)):
            found = project.resolve(member, name, classes=True)  # a trainer class's constructor too
            if found is not None and (found[0].name, found[1]) in known:
                calls[name] = known[(found[0].name, found[1])]
                fed.add((found[0].name, found[1]))
        # A caller converted before (ddpify's own output, or by an earlier group) or another
        # script (its own group shards what it passes) feeds the function, but is not
        # planned again here.
        if calls and member.path in links and member.path in roles:
            links[member.path].parameter_loaders = calls
            callers.append(member.path)
    for (module, function), _ in trainers.items():
        if (module, function) not in fed:
            # (a trainer picked from a table, AttentionedDeepPaint's TRIANER_MAP, BERT4Rec's
            # TRAINERS[code](...): it shards what it draws, at run time, as a single file does)
            path = project.paths[module]
            links[path].unfed = links[path].unfed | {function}
            if path not in callers:
                callers.append(path)
    return callers


def _route(project: Project, member: ModuleInfo, foreign, builders: dict, converted: dict, options: ConvertOptions) -> None:
    """A loader ``member`` trains on comes from a function of another module: that module
    shards it. If the function cannot be found, ``member`` is refused (with
    ``--allow-partial``, converted with a warning)."""
    found = project.resolve(member, foreign.function)
    if found is None:
        reason = (
            f"the training loader comes from `{foreign.function}()`, which is not a function of this project "
            "that ddpify can find: every rank would train on all the data"
        )
        change = functools.partial(_untraced_loader, reason=reason, allow_partial=options.allow_partial)
        converted[member.path] = _patch(converted[member.path], change)
        return
    module, function = found
    builders.setdefault(module.path, {}).setdefault(function, set()).add(foreign.index)


# Codes of a conversion that shards training data: a DistributedSampler added, a loader sharded
# where the training loop draws it, a drawn batch split.
# (DDP314: the whole batch drawn alike on every rank, the wrapped model's calls taking their
# share of it, as DataParallel's scatter did: rsfn's batch-coupled reconstruction loss)
SHARDING_CODES = ("DDP301", "DDP312", "DDP313", "DDP314", "DDP315", "DDP406")  # (DDP406: whole batches drawn alike, each step's split)


def _shards(result: FileResult) -> bool:
    """Does this file's conversion shard training data, or did the file already (its own
    DistributedSampler)? Read from what was done, not from the text: the helper block names
    DistributedSampler in files that shard nothing."""
    return any(d.code in SHARDING_CODES for d in result.diagnostics) or "DistributedSampler" in result.source


def _wraps_to_evaluate(project: Project, info: ModuleInfo) -> bool:
    """A module with no entry point that wraps a model in DataParallel (not only names the
    class), that no module of the project imports (a serving tool runs it), and that calls no
    backward(), nor a project function that does."""
    if info.runs or not WRAP_CALL.search(info.source) or RETURNED_WRAP.search(info.source):
        return False  # (a factory that returns the wrapped model builds it for a trainer elsewhere)
    last = re.escape(info.name.rpartition(".")[2])
    imported = re.compile(rf"^\s*(from|import)\s.*\b{last}\b", re.MULTILINE)
    if any(imported.search(source) for path, source in project.sources.items() if path != info.path):
        return False
    members = [info, *project.reachable(info)]
    return not any(BACKWARD.search(member.source) for member in members) or _evaluates_only(project, info, members)


WRAP_CALL = re.compile(r"(?<!Distributed)DataParallel\w*\(")
RETURNED_WRAP = re.compile(r"^\s*return\b.*(?<!Distributed)DataParallel\w*\(|^\s*return\s+(model|net|network)\b", re.MULTILINE)


def _untraced_loader(result: FileResult, reason: str, allow_partial: bool) -> FileResult:
    if allow_partial and not result.error:
        warning = Diagnostic(1, 1, "DDP308", f"{reason} (converted anyway: --allow-partial)", Severity.WARNING)
        return replace(result, diagnostics=(*result.diagnostics, warning))
    return _refusal(result, "DDP308", reason)


# A loss class that selects elements by a mask (FastSpeech2's model/loss.py: `masked_select`):
# its means are weighted per rank where it is defined (DDP135)
MASKED_LOSS_CLASS = re.compile(r"^\s*class \w*(Loss|Criterion)\w*\b", re.IGNORECASE | re.MULTILINE)


def _has_side_effects(source: str) -> bool:
    if MASKED_LOSS_CLASS.search(source) and ("masked_select(" in source or "mask]" in source):
        return True
    return any(word in source for word in SIDE_EFFECT_WORDS)


def _wraps_stay_inside(member: ModuleInfo) -> bool:
    """Does every DataParallel wrap of this module stay in the function that makes it: bound to
    a local name that is never returned, stored, or handed to a call (Thin-Plate-Spline's
    ``train()``: ``generator_full = DataParallel(...)``, trained there)? Then no other module
    trains the wrapped model."""
    if not member.wraps:
        return True
    try:
        tree = ast.parse(member.source)
    except SyntaxError:
        return False
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    wraps = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and WRAP_CALL.search(ast.unparse(node.func).rpartition(".")[2] + "(")]
    for wrap in wraps:
        statement = parents.get(wrap)
        while isinstance(statement, ast.Call) and isinstance(parents.get(statement), ast.Attribute):
            statement = parents.get(parents.get(statement))  # (`DataParallel(m).cuda()`)
        function = statement
        while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = parents.get(function)
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name)) or function is None:
            return False
        name = statement.targets[0].id
        for node in ast.walk(function):
            if isinstance(node, (ast.Return, ast.Yield)) and node.value is not None and _names(node.value) & {name}:
                return False
            if isinstance(node, ast.Assign) and not all(isinstance(t, ast.Name) for t in node.targets) and name in _names(node.value):
                return False
            if isinstance(node, ast.Call) and any(name in _names(arg) for arg in [*node.args, *(k.value for k in node.keywords)]):
                if not (isinstance(node.func, ast.Name) and node.func.id in ("print", "len", "isinstance", "hasattr", "getattr", "type")):
                    return False
        if any(isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names for node in ast.walk(function)):
            return False
    return True


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
