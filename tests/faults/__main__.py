"""`make chaos`: every fault scenario's long version on one private stack, one
line each (scenario expected= lost= dup_runs= dup_effects= recovery_s=), then
each one's notes; exit 1 when any checker found a violation (in a scenario
not listed in KNOWN_FAILURES). A scenario that found one keeps its services'
logs (stacks and consumer state included: harness.Platform.diagnose), and
the last line says where.
`python -m tests.faults NAME ...` runs only the scenarios named;
`--keep-logs` keeps every scenario's logs (to read how one recovered)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from tests.faults.harness import private_stack
from tests.faults.scenarios import FAULTS, KNOWN_FAILURES, LONG, NEEDS, run


def main(args: list[str]) -> int:
    keep = "--keep-logs" in args
    names = [a for a in args if a != "--keep-logs"]
    unknown = set(names) - set(FAULTS)
    if unknown:
        print(f"unknown scenarios: {sorted(unknown)}; known: {sorted(FAULTS)}", file=sys.stderr)
        return 2
    reports = []
    broken: list[str] = []  # scenarios that raised instead of reporting
    logs = Path(tempfile.mkdtemp(prefix="cw-chaos-"))
    with private_stack() as stack:
        for name in names or FAULTS:
            if why := NEEDS.get(name, lambda: None)():
                print(f"{name:<14} skipped: {why}", flush=True)
                continue
            log_dir = logs / name
            log_dir.mkdir()
            try:
                report = run(stack, name, LONG[name], log_dir)
            except Exception as exc:  # did not catch up, or the harness failed: the next goes on
                print(f"{name:<14} failed: {exc}", flush=True)
                broken.append(name)
                continue
            print(report.line(), flush=True)
            reports.append(report)
            if not report.problems and not keep:
                shutil.rmtree(log_dir, ignore_errors=True)
    print()
    for report in reports:
        recoveries = ", ".join(f"{s:.1f}" for s in report.recover_s)
        print(f"{report.scenario}: recovery_s per fault [{recoveries}]")
        for line in [*report.notes, *report.problems]:
            print(f"  {line}")
        if report.scenario in KNOWN_FAILURES:
            print(f"  known failure: {KNOWN_FAILURES[report.scenario]}")
    failed = [r for r in reports if r.problems and r.scenario not in KNOWN_FAILURES]
    if keep:
        print(f"\nlogs of every scenario: {logs}")
    elif broken or any(r.problems for r in reports):
        print(f"\nlogs of the scenarios that failed or found a problem: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 1 if failed or set(broken) - set(KNOWN_FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
