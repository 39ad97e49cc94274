"""``python -m qwen3_trn.status <run or sweep dir>... [--wait] [--json]``: the current state of runs and sweeps.

Runs whose ranks run elsewhere are asked of their launcher; a local run recorded running whose
process is gone is settled as died. The states are written back to the records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qwen3_trn.cli.exits import imports_of_entry_point

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.results.processes import PROCESS_SECTION, where
    from qwen3_trn.results.records import RunStatus, is_sweep_dir, job_section, read_summary, run_dirs_under
    from qwen3_trn.sweeps.sweep import refresh_runs, refresh_sweep


def _row(record: dict, num=None) -> dict:
    job = job_section(record)
    status = record.get("status")
    summary = read_summary(record["run_dir"]) if num is not None and record.get("run_dir") else record
    process = record.get(PROCESS_SECTION) or summary.get(PROCESS_SECTION) or {}
    return {
        "run_dir": record.get("run_dir"),
        "status": status,
        "launcher": job.get("launcher"),
        "job_id": job.get("id"),
        "state": job.get("state") or (where(process) if status == RunStatus.running else None),
        "last_step": record.get("last_step", summary.get("last_step")),
        "log": record.get("log") or (job.get("stderr") if status == RunStatus.failed else job.get("stdout")),
        "num": num,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_trn.status", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="run directories or sweep directories")
    parser.add_argument("--wait", action="store_true", help="wait until every job has ended")
    parser.add_argument("--json", action="store_true", help="print the states as JSON")
    args = parser.parse_args(argv)

    rows = []
    for given in args.dirs:
        path = Path(given).resolve()
        if not path.is_dir():
            parser.error(f"{given} is not a directory")
        if is_sweep_dir(path):
            rows += [_row(job, job.get("num")) for job in refresh_sweep(path, wait=args.wait)["jobs"]]
        else:
            rows += [_row(summary) for summary in refresh_runs(run_dirs_under(path), wait=args.wait)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            num = f"#{row['num']} " if row.get("num") is not None else ""
            step = f"last step {row['last_step']}" if row["last_step"] is not None else ""
            print(
                f"{num}{row['status'] or '?':<10} job {row['job_id'] or '-':<8} {row['state'] or '':<11} {step:<15} {row['run_dir']}"
                + (f"  log: {row['log']}" if row["log"] else "")
            )
    return 1 if any(r["status"] in (RunStatus.failed, RunStatus.cancelled, RunStatus.died) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
