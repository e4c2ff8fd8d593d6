"""`make chaos`: every fault scenario's long version on one private stack, one
line each (scenario expected= lost= dup_runs= dup_effects= recovery_s=), then
each one's notes; exit 1 when any checker found a violation."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.faults.harness import private_stack
from tests.faults.scenarios import FAULTS, LONG, run


def main() -> int:
    reports = []
    with private_stack() as stack, tempfile.TemporaryDirectory(prefix="cw-chaos-") as tmp:
        for name in FAULTS:
            log_dir = Path(tmp) / name
            log_dir.mkdir()
            report = run(stack, name, LONG[name], log_dir)
            print(report.line(), flush=True)
            reports.append(report)
    print()
    for report in reports:
        recoveries = ", ".join(f"{s:.1f}" for s in report.recover_s)
        print(f"{report.scenario}: recovery_s per fault [{recoveries}]")
        for line in [*report.notes, *report.problems]:
            print(f"  {line}")
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
