"""``python -m qwen3_trn.report <sweep dir | run dirs...> [--out DIR] [--publish]``."""

from __future__ import annotations

import argparse
import sys

from qwen3_trn.report import ReportError, build_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen3_trn.report",
        description="Compare finished runs: report.html (plots), report.md and report.csv, without any server.",
    )
    parser.add_argument("paths", nargs="+", help="a sweep directory, run directories, or folders holding them")
    parser.add_argument("--out", help="where to write the report (default: the one directory given, else .)")
    parser.add_argument(
        "--publish", action="store_true", help="also publish a wandb Report (needs wandb-workspaces, an API key and the network)"
    )
    parser.add_argument("--title", help="report title")
    args = parser.parse_args(argv)
    try:
        result = build_report(args.paths, out_dir=args.out, publish=args.publish, title=args.title)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs = result.collection.runs
    print(f"{len(runs)} runs ({', '.join(sorted({r.status for r in runs}))}); swept: {', '.join(result.collection.swept_keys) or 'none'}")
    for note in result.notes:
        print(f"  {note}")
    print(f"report: {result.html}\n        {result.markdown}\n        {result.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
