"""What each ``convert`` code means, read from the transforms' docstrings.

Each transform module documents its codes in its docstring, one paragraph per code with a
before/after example; ``ddpify rule DDP105`` shows that paragraph. The modules are read as
text (``ast``), never imported: ``rule`` must not pay for libcst.
"""

from __future__ import annotations

import ast
import functools
import re
from importlib import resources

CODE_LINE = re.compile(r"^(DDP\d{3})  ")  # "DDP105  text": a paragraph, not a "DDP105/DDP106:" title
# Codes raised outside the transforms (parsing, the analysis pass, project mode).
OTHER_CODES = {
    "DDP001": "DDP001  (error) the file does not parse; Python's own position and message are given "
    "(`.cuda(async=True)` is a syntax error since Python 3.7: it is `.cuda(non_blocking=True)`).",
    "DDP002": "DDP002  (error) the rewrite does not compile on the running Python where the original does (code "
    "spliced where this grammar refuses it): a ddpify defect; the file is left as it is, nothing half-written.",
    "DDP003": "DDP003  (error) the converted text would still build torch's DataParallel (`nn.DataParallel(...)` in a "
    "form the analysis did not see as torch's: `nn` taken from a project module, a module outside the project, or a "
    "star import): under torchrun every rank would run its own DataParallel job. Nothing is written; the message names "
    "where the name comes from: import it from torch in that file (`import torch.nn as nn`) and convert again, or "
    "convert the folder so the module is read.",
    "DDP014": "DDP014  (warning) the script's own DDP path (pytorch/examples' --multiprocessing-distributed, a "
    "--distributed flag) trains on DataLoaders built here, or by a project function (qa-hard-em), with no DistributedSampler anywhere in the script or the project modules it imports (EfficientDet.Pytorch): "
    "under its switch every rank would train on all the data. That path is not taken: its DataParallel path is "
    "converted like any other (sampler, batch share, rank-0 writes), and the launch line runs it without the switch.",
    "DDP015": "DDP015  `.cuda(async=True)` and other `async=` keywords (Python before 3.7, where `async` became a "
    "keyword and the file stopped parsing) read as `non_blocking=`, their name since: renamed in the converted file.",
    "DDP210": "DDP210  (error) project mode (`ddpify convert DIR`): another file of the project was refused, so "
    "this one is left untouched too: a project converts whole or not at all (a converted module under an unconverted "
    "entry would fail at its first collective; a model class found by importlib links files the import graph does not "
    "show). The refused file's own diagnostics say why; `--allow-partial` converts the rest.",
    "DDP211": "DDP211  (error; a warning with `--allow-partial`) project mode: the group's model is wrapped in DistributedDataParallel, but no "
    "training DataLoader was found sharded in the entry script or the modules it imports (a loader built inside a "
    "class, a model or dataset loaded dynamically with importlib, a module outside the project): every rank would "
    "train on all the data. The whole group is left untouched; shard the data by hand.",
    "DDP212": "DDP212  (warning) project mode: a script uses the project's DataParallel models but trains nothing "
    "(no backward() in it or the project functions it calls: evaluation, export): it is left as it is. Modules converted "
    "for the project's training scripts allow a process with no process group, so it runs as one process.",
    "DDP215": "DDP215  (warning) project mode: a module trains a model that no DataParallel wrap of the project "
    "reaches (every wrap stays inside the function that makes it, and this module wraps none: Thin-Plate-Spline-Motion-"
    "Model's second stage, which its README runs on one GPU): its loops are left as they are, neither sharded nor "
    "gathered; under the launch line each process trains its own copy, and its writes go as the module's other "
    "conversions say.",
    "DDP216": "DDP216  (warning) project mode: a DataParallel module with no entry point that no file of the "
    "project imports, or names in a string (a class path found at run time), is an old copy no one runs (W-DCGAN-GP's "
    "`temp/attention/train.py`): it is left as it is, and the files the scripts import convert without it (refused "
    "alone, DDP202, it held back the whole project).",
    "DDP217": "DDP217  (warning) project mode: a module that was refused on its own, which no script that trains "
    "imports directly or not (an evaluation helper that wraps for inference: Deep_Metric's Model2Feature.py, imported "
    "by a test script that trains nothing, DDP212): its refusal is about code the converted training never runs, so it "
    "is left as it is and the training scripts' files convert without it. A script that runs is never left so.",
    "DDP213": "DDP213  (warning) project mode: an imported module defines a DataParallel subclass that ddpify "
    "cannot convert (Synchronized-BatchNorm-PyTorch's DataParallelWithCallback), but nothing else in the "
    "group uses it: the module is left as it is instead of refusing the project.",
    "DDP143": "DDP143  (error) backward() runs inside a module's own forward in a file that wraps (HiSD: one module "
    "holds G and D, and its forward computes the loss asked for and calls backward() before it returns): DDP averages "
    "the gradients of a backward that follows the wrapped forward's return, so this one is never synchronised and the "
    "next forward stops. Return the loss from forward() and call backward() on it after the call, by hand.",
    "DDP115": "DDP115  (error) a training loop calls backward() more often than the wrapped model's forward "
    "(pix2pixHD: one wrapped model returns the G and D losses, each gets its own backward): DDP synchronises "
    "gradients once per forward, so the second backward through the same forward fails. Wrap the networks each "
    "loss trains separately, by hand.",
    "DDP309": "DDP309  (error) project mode: a function (or a trainer class, through `self.loader = loader` in its "
    "constructor) trains on a loader passed to it (`train_one_epoch(model, "
    "criterion, optimizer, data_loader, ...)` in engine.py), and what a caller passes cannot be traced to a "
    "DataLoader: every rank would train on all the data. (Where it can, the caller's loader is sharded where it is "
    "built and gets set_epoch in the loop around the call; where no module calls it by a name ddpify can follow, a "
    "trainer picked from a table, its loop shards what it draws at run time, DDP312.)",
    "DDP214": "DDP214  (error) single-file mode: the script names no DataParallel, but it trains (backward, an "
    "optimizer) and imports a module of its project that wraps a model in DataParallel (`model, params = "
    "generate_model(opt)`, `model.parallelize()`): converted alone it would stay DataParallel. Likewise a script "
    "that wraps, whose project modules test for DataParallel (`isinstance(model, nn.DataParallel)` before saving, "
    "PointRCNN): converted alone, its DDP model would take their other branch. Convert the folder "
    "(`ddpify convert DIR`): the script and those modules are converted together.",
    "DDP004": "DDP004  (error) a DataParallel subclass with its own scatter/gather logic, DataParallel written "
    "by hand from its parts (`replicate`, `parallel_apply`), the functional `data_parallel()` where it is not a "
    "model class's forward on a part of `self` whose every instance is bound to a name of its own, or DataParallel "
    "given no module: convert it by hand. (A subclass that only forwards attribute reads to its module is converted: "
    "its base becomes DistributedDataParallel; DCGAN's `data_parallel(self.main, ...)` in forward() is converted, "
    "DDP136.)",
}


@functools.lru_cache(maxsize=1)
def convert_codes() -> dict[str, str]:
    """Code -> its paragraph (with examples) from the transform that emits it."""
    found = dict(OTHER_CODES)
    for entry in sorted(resources.files("ddpify.transforms").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".py"):
            continue
        docstring = ast.get_docstring(ast.parse(entry.read_text(encoding="utf-8"))) or ""
        found.update(_paragraphs(docstring, entry.name))
    return dict(sorted(found.items()))


def _paragraphs(docstring: str, module: str) -> dict[str, str]:
    """Paragraphs that start with a code, up to the next one (examples included)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in docstring.splitlines():
        match = CODE_LINE.match(line)
        if match:
            current = sections.setdefault(match.group(1), [])
        if current is not None:
            current.append(line)
    return {code: "\n".join(lines).rstrip() + f"\n\n(ddpify/transforms/{module})" for code, lines in sections.items()}


def summary(text: str) -> str:
    """The first sentence-ish line of a code's paragraph, without the code."""
    first = " ".join(text.split("\n\n")[0].split())
    return first.split(" ", 1)[1] if " " in first else first
