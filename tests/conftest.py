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
