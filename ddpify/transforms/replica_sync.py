"""DDP144: synchronisation between DataParallel's replicas inside one process.

A synchronised BatchNorm written for DataParallel (IntRA-KD's ``models/sync_bn``: a thread that
waits for the statistics of every GPU's replica, counted by ``Synchronize.init(len(gpus))``;
PyTorch-Encoding's ``SyncBatchNorm``) meets the other replicas inside the one process
DataParallel runs. Under DDP each process holds one replica: its layers wait for replicas that
are never there (a hang at the first forward) or compute each process's own statistics. torch's
``SyncBatchNorm`` synchronises across DDP's processes instead; it is put in by hand, before
the wrap. (Synchronized-BatchNorm-PyTorch's ``patch_replication_callback`` and
``DataParallelWithCallback`` are converted: DDP107 and the subclass plan.)

DDP144  (error; a warning with ``--allow-partial``) the file calls into a synchronised BatchNorm
module made for DataParallel (a module named so, not torch's or apex's), or defines a BatchNorm
layer beside threads::

    from models import sync_bn
    sync_bn.Synchronize.init(args.gpus)
    # refused: replace it with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before the
    # wrap (and drop the replica synchronisation), then convert
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis import dotted, walk
from ddpify.transforms.base import Transform

SYNC_BN = re.compile(r"(?i)^(sync_?bn|sync_?batch_?norm\w*|synchroni[sz]ed_?batch_?norm\w*|syncbn\w*)$")
# converted elsewhere (DDP107, the DataParallelWithCallback plan), or made for DDP
HANDLED = ("patch_replication_callback", "DataParallelWithCallback")
FOR_DDP = ("torch", "apex")


class ReplicaSyncTransform(Transform):
    CODE_PREFIX = "DDP144"

    def check(self) -> None:
        if not self.facts.wraps or any(word in self.context.module.code for word in HANDLED):
            return
        found = self._sync_import() or self._layer_beside_threads()
        if found is None:
            return
        node, shown = found
        self.context.report_unsound(
            node, "DDP144",
            f"{shown} synchronises BatchNorm between DataParallel's replicas inside one process; under DDP each "
            "process holds one replica, so it waits for replicas that are not there (a hang) or keeps each "
            "process's own statistics: replace it with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
            "the wrap, then convert",
        )

    def _sync_import(self) -> tuple[cst.CSTNode, str] | None:
        """A call through a module imported under a synchronised BatchNorm's name
        (``from models import sync_bn``, then ``sync_bn.Synchronize.init(n)``); its layers
        alone (``SynchronizedBatchNorm2d(64)`` with no callback) synchronise nothing."""
        modules = set()
        for node in walk(self.context.module):
            if isinstance(node, cst.ImportFrom) and node.module is not None and not isinstance(node.names, cst.ImportStar):
                if (dotted(node.module) or "").split(".")[0] not in FOR_DDP:
                    modules |= {alias.evaluated_alias or alias.evaluated_name for alias in node.names}
            elif isinstance(node, cst.Import):
                modules |= {alias.evaluated_alias or alias.evaluated_name for alias in node.names if alias.evaluated_name.split(".")[0] not in FOR_DDP}
        synced = {name for name in modules if SYNC_BN.match(name.rpartition(".")[2])}
        for node in walk(self.context.module):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                root = dotted(node.func) or ""
                if any(root.startswith(name + ".") for name in synced):
                    return node, f"`{self.context.code(node.func)}`"
        return None

    def _layer_beside_threads(self) -> tuple[cst.CSTNode, str] | None:
        code = self.context.module.code
        if not re.search(r"^\s*(import threading|from threading import)", code, re.M):
            return None
        for node in walk(self.context.module):
            if isinstance(node, cst.ClassDef) and any("BatchNorm" in (dotted(base.value) or "") for base in node.bases):
                return node, f"`{node.name.value}`, a BatchNorm layer beside threads,"
        return None
