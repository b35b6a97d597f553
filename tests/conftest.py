from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite expected .ddp.py/.diag.txt files")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return request.config.getoption("--update-golden")


def fixture_inputs(area: str = "*") -> list[Path]:
    """Every fixture input: fixtures/<area>/<name>.py, not the expected outputs."""
    return sorted(p for p in FIXTURES.glob(f"{area}/*.py") if not p.name.endswith(".ddp.py"))


# torch 2.13's gloo backend on these CPU machines sometimes aborts a rank during interpreter
# shutdown, after the script has finished and destroyed its process group ("terminate
# called without an active exception", exit -6). A minimal torch-only DDP script shows it
# too (a few runs in a hundred); such a run is repeated, anything else fails the test.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def run_launched(command: list[str], attempts: int = 5, **kwargs):
    """subprocess.run for torchrun commands, repeating runs lost to the gloo exit abort (about one
    run in six on a quiet machine, more under load: a script's own DDP path lost three in a row)."""
    import subprocess

    for attempt in range(1, attempts + 1):
        result = subprocess.run(command, capture_output=True, text=True, **kwargs)
        result.attempts = attempt  # (a repeated run may have left files: tests that count them ask)
        if result.returncode == 0 or GLOO_EXIT_ABORT not in result.stderr:
            return result
    return result
