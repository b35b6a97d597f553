"""Compare the final parameters two probe runs recorded (for ``verify --equivalence``).

    python -m ddpify.verify.compare LEFT.pt RIGHT.pt RTOL ATOL

Prints one JSON object: ``{"equal": bool, "reason": str, "max_abs_diff": float | null}``.
A launched process, like the probe: the CLI never imports torch.
"""

from __future__ import annotations

import json
import sys

import torch


def compare(left: list, right: list, rtol: float, atol: float) -> dict:
    if len(left) != len(right) or not left:
        return {"equal": False, "reason": f"{len(left)} vs {len(right)} optimizers", "max_abs_diff": None}
    worst = 0.0
    for number, (group_a, group_b) in enumerate(zip(left, right)):
        if [t.shape for t in group_a] != [t.shape for t in group_b]:
            return {"equal": False, "reason": f"optimizer {number}: parameter shapes differ", "max_abs_diff": None}
        for a, b in zip(group_a, group_b):
            a, b = a.double(), b.double()
            worst = max(worst, (a - b).abs().max().item() if a.numel() else 0.0)
            if not torch.allclose(a, b, rtol=rtol, atol=atol):
                return {"equal": False, "reason": f"optimizer {number}: weights differ", "max_abs_diff": worst}
    return {"equal": True, "reason": "", "max_abs_diff": worst}


def main() -> None:
    left, right, rtol, atol = sys.argv[1:5]
    result = compare(torch.load(left)["params"], torch.load(right)["params"], float(rtol), float(atol))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
