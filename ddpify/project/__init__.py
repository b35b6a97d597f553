"""Project mode: ``ddpify convert DIR`` converts a project with one view across its files.

Real DataParallel code is spread over a project: the entry script parses arguments and
calls a trainer in another module, or trains a model that a factory in ``models/`` wraps
on loaders that a builder in ``data/`` returns, while utils print and save. Converted file
by file, the module that wraps is refused (no entry point for the set-up) and the entry
script has nothing to convert. Here every file gets a role:

- **script**: a file that wraps with DataParallel and runs as a script (a ``__main__``
  block or module-level training): converted as on its own;
- **entry**: a script that does not wrap but imports project modules that do: gets the
  process-group set-up and the launch line; if it trains (the model came from a factory),
  its training loaders are sharded and its side effects guarded as in a script;
- **library**: a module imported by a script: one that wraps (a factory, a trainer class),
  trains, builds loaders another module trains on, or prints and saves (utils). Converted
  without set-up (its code runs after the entry's ``ddp_setup()``), with only the helpers
  it uses, nothing guarded at import time and no barrier (its callers are not in sight).

A loader that a function of another module returns (``train_loader, val_loader =
build_loaders(args)``) is sharded where that function builds it and gets ``set_epoch``
where it is iterated: the training module is converted first and says which functions'
results it trains on; those modules are then converted with that knowledge.

A project is converted whole or not at all: if one of its files is refused, every file is
left untouched (DDP210; a converted library under an unconverted entry would fail at the
first collective, and modules meet in ways the import graph does not show, such as a model
class found by importlib). ``--allow-partial`` converts the rest.

The import graph comes from :mod:`ast` (fast, no libcst), parsed lazily: scripts and
DataParallel modules first, then what they import (``graph.py``). Conversion comes from the
engine, one ``FileConversion`` per file, so that a module several entry scripts import is
parsed, analysed and rewritten once (``groups.py``); what is refused or left as it is, and
why, is ``verdicts.py``'s. Files are spread over worker processes where that pays
(``ddpify/workers.py``).
"""
from ddpify.project.graph import ModuleInfo, Project, module_name, read_module
from ddpify.project.groups import convert_project

__all__ = ["ModuleInfo", "Project", "convert_project", "module_name", "read_module"]
