"""MPS smoke-test client: reports the CUDA_MPS_* limits it was started with and, when torch with CUDA is
present, whether allocations below and above its pinned memory limit succeed. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

GIB = 1024**3


def _try_alloc(torch, nbytes: int) -> str:
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del block
        torch.cuda.empty_cache()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any CUDA failure is the answer we report
        return f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def main(argv: list[str]) -> int:
    limit_mib = int(argv[argv.index("--limit-mib") + 1]) if "--limit-mib" in argv else None
    report: dict = {
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith("CUDA_MPS_") or k == "CUDA_VISIBLE_DEVICES"
        },
        "pid": os.getpid(),
    }
    try:
        import torch  # optional: not a dependency of the agent
    except ImportError:
        report["torch"] = "not installed: allocations not tried"
        print(json.dumps(report), flush=True)
        return 0
    if not torch.cuda.is_available():
        report["torch"] = f"torch {torch.__version__} without a usable CUDA device: allocations not tried"
        print(json.dumps(report), flush=True)
        return 0
    report["torch"] = torch.__version__
    report["device"] = torch.cuda.get_device_name(0)
    free_b, total_b = torch.cuda.mem_get_info()
    report["mem_get_info_mib"] = {"free": free_b // 2**20, "total": total_b // 2**20}
    if limit_mib:
        below = max(limit_mib * 2**20 - GIB, limit_mib * 2**20 // 2)
        above = limit_mib * 2**20 + 2 * GIB
        report["alloc_below_limit"] = {"mib": below // 2**20, "result": _try_alloc(torch, below)}
        report["alloc_above_limit"] = {"mib": above // 2**20, "result": _try_alloc(torch, above)}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
