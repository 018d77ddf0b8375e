"""python -m bench NAME [--seconds N] [--write BENCHMARKS.md]; NAME is a module of bench/ or `all`."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import platform
import re
import sys
from pathlib import Path

from bench.common import Figure

BENCHMARKS = [
    "seed",
    "tick",
    "host_ops",
    "api",
    "api_host_ops",
    "api_agent_steps",
    "gantt",
    "simulate",
    "reliability",
    "embedded_soak",
    "fleet_apply",
    "sim_meta",
]
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--seconds", type=float, default=None, help="how long sustained benchmarks run")
    parser.add_argument("--write", type=Path, default=None, help="rewrite the figures table in this file")
    args = parser.parse_args()
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be positive")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

    figures: list[Figure] = []
    for name in BENCHMARKS if args.name == "all" else [args.name]:
        module = importlib.import_module(f"bench.{name}")
        print(f"bench: running {name}", file=sys.stderr, flush=True)
        for figure in module.run(args.seconds):
            print(figure.line(), flush=True)
            figures.append(figure)
    if args.write:
        write_table(args.write, figures)
    return 0


def write_table(path: Path, figures: list[Figure]) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        raise SystemExit(f"{path} has no {START} … {END} section to rewrite")
    existing = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.*)$", text.split(START)[1].split(END)[0], re.M))
    stamp = f"{dt.date.today():%Y-%m-%d}, {platform.machine()}, {os.cpu_count()} cores"
    for figure in figures:
        existing[figure.name] = f"{figure.value:g} {figure.unit} | {stamp} | {figure.how} |"
    rows = "\n".join(f"| `{name}` | {row}" for name, row in sorted(existing.items()))
    table = f"| figure | value | measured | how to reproduce |\n|---|---|---|---|\n{rows}"
    before, rest = text.split(START, 1)
    path.write_text(f"{before}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    sys.exit(main())
