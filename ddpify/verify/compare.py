"""Compare the parameters two probe runs recorded (for ``verify --equivalence``).

    python -m ddpify.verify.compare ORIGINAL.pt CONVERTED.pt RTOL ATOL

Prints one JSON object: ``{"equal": bool, "reason": str, "max_abs_diff": float | null}``.
A launched process, like the probe: the CLI never imports torch.
"""

from __future__ import annotations

import json
import sys

import torch


def compare(original: list, converted: list, rtol: float, atol: float) -> dict:
    if len(original) != len(converted) or not original:
        return _unequal(f"{len(original)} vs {len(converted)} optimizers")
    # NaN compares unequal to everything and drops out of max(): without this a run that
    # diverged would read "weights differ (max |difference| 0.0)", or match another NaN run.
    for label, groups in (("original", original), ("converted", converted)):
        broken = sum(_nonfinite(t) for group in groups for t in group)
        if broken:
            return _unequal(f"{broken} NaN or infinite weight value(s) in the {label} run")
    worst = 0.0
    for number, (group_a, group_b) in enumerate(zip(original, converted)):
        if [t.shape for t in group_a] != [t.shape for t in group_b]:
            return _unequal(f"optimizer {number}: parameter shapes differ")
        for a, b in zip(group_a, group_b):
            a, b = a.double(), b.double()
            worst = max(worst, (a - b).abs().max().item() if a.numel() else 0.0)
            if not torch.allclose(a, b, rtol=rtol, atol=atol):
                return _unequal(f"optimizer {number}: weights differ", worst)
    return {"equal": True, "reason": "", "max_abs_diff": worst}


def _nonfinite(tensor) -> int:
    return int((~torch.isfinite(tensor)).sum()) if tensor.is_floating_point() else 0


def _unequal(reason: str, worst: float | None = None) -> dict:
    return {"equal": False, "reason": reason, "max_abs_diff": worst}


def main() -> None:
    original, converted, rtol, atol = sys.argv[1:5]
    result = compare(torch.load(original)["params"], torch.load(converted)["params"], float(rtol), float(atol))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
