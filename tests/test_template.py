"""The inlined set-up block is real code: run it, and keep the converter's view of it in sync."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpify.transforms.process_group import TEMPLATE_IMPORTS, TEMPLATE_NAMES, template_source

torch = pytest.importorskip("torch")
from ddpify.templates import ddp_setup as template  # noqa: E402  (needs torch)


def test_block_defines_exactly_the_names_the_converter_reserves():
    defined = [s.name.value for s in cst.parse_module(template_source()).body if isinstance(s, cst.FunctionDef)]
    assert defined == list(TEMPLATE_NAMES)


def test_block_imports_are_what_the_converter_schedules():
    header = open(template.__file__).read().split("# ddpify:begin")[0]
    for module, _, alias in TEMPLATE_IMPORTS:
        assert f"import {module}" + (f" as {alias}" if alias else "") in header


@pytest.mark.parametrize(
    "nodelist, host",
    [("node1", "node1"), ("gpu[03-05,09],cpu1", "gpu03"), ("a,b[1-2]", "a"), ("n[7]-ib,x", "n7-ib"), ("h[10-12]", "h10")],
)
def test_first_slurm_host(nodelist, host):
    assert template.ddp_first_slurm_host(nodelist) == host


def test_world_of_one_without_a_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    template.ddp_setup()
    try:
        assert torch.distributed.get_world_size() == 1 and torch.distributed.get_rank() == 0
        assert template.ddp_local_batch_size(32) == 32
        assert template.ddp_device() == torch.device("cpu") and template.ddp_device_ids() is None
        template.ddp_setup()  # a second call is harmless
    finally:
        template.ddp_cleanup()
    assert not torch.distributed.is_initialized()
    template.ddp_cleanup()  # and so is cleaning up twice


def test_slurm_variables_become_torchrun_ones(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NODELIST", "localhost")
    monkeypatch.setenv("MASTER_PORT", "0")  # let the store pick a free port
    template.ddp_setup()
    try:
        import os

        assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]) == ("0", "1", "localhost")
        assert torch.distributed.get_world_size() == 1
    finally:
        template.ddp_cleanup()


def test_batch_that_does_not_divide_stops_with_a_message(monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    with pytest.raises(SystemExit, match="does not divide evenly among 3"):
        template.ddp_local_batch_size(32)
