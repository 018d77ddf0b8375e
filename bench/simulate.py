"""The simulator at 10,000 hosts over 30 days (target: under 10 minutes for the trains), both train
paces (domain-synchronous and sliding) and the peer policies on the same fleet and upgrade stream, as
a side-by-side table in BENCHMARKS.md.

python -m bench simulate [--seconds N]: with --seconds, the days are cut to fit a quick try
(N / 20 days); without, the full 30 days. Wall times include creating the scratch databases.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, Figure, manage, scratch_database_url

HOSTS, POOLS, DOMAIN = 10_000, 10, 50
START, END = "<!-- simulation:start -->", "<!-- simulation:end -->"
TRAINS, PEERS = ("trains", "trains-sliding"), ("rolling", "lockstep")


def _arguments(days: float, policies: str, out: Path) -> list[str]:
    return [
        "simulate", "--hosts", str(HOSTS), "--pools", str(POOLS), "--hosts-per-domain", str(DOMAIN),
        "--days", f"{days:g}", "--policies", policies, "--lanes", "2", "--out", str(out), "--seed", "1",
    ]  # fmt: skip


def run(seconds: float | None = None) -> list[Figure]:
    days = 30.0 if seconds is None else max(0.5, seconds / 20)
    url = scratch_database_url("bench_simulate")  # the simulate command makes its scratch lanes next to it
    manage("migrate", "-v0", database_url=url)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    with tempfile.TemporaryDirectory() as work:
        trains_out, peers_out = Path(work) / "trains", Path(work) / "peers"
        trains_s, _ = manage(*_arguments(days, ",".join(TRAINS), trains_out), database_url=url)
        print(f"bench simulate: both train paces over {days:g} days took {trains_s:.0f} s", file=sys.stderr, flush=True)
        peers_s, _ = manage(*_arguments(days, ",".join(PEERS), peers_out), database_url=url)
        runs = json.loads((trains_out / "runs.json").read_text()) | json.loads((peers_out / "runs.json").read_text())
    summary = _side_by_side(days, runs)
    how = (
        f"python -m bench simulate: manage.py simulate --hosts {HOSTS} --pools {POOLS} --hosts-per-domain {DOMAIN} "
        f"--days {days:g} --lanes 2 (wall time, scratch databases included)"
    )
    totals = summary["totals"]
    figures = [
        Figure(f"simulate_{HOSTS // 1000}k_{days:g}d_trains_s", round(trains_s, 1), "s", how + ", both train paces"),
        Figure(f"simulate_{HOSTS // 1000}k_{days:g}d_peers_s", round(peers_s, 1), "s", how + ", rolling and lockstep"),
    ]
    for policy in (*TRAINS, *PEERS):
        row = totals.get(policy) or {}
        if row.get("drains_per_host") is not None:
            figures.append(Figure(f"simulate_drains_per_host_{policy}", row["drains_per_host"], "drains", how))
    return figures


def _side_by_side(days: float, runs: dict) -> dict:
    import django

    django.setup()
    from simulation.config import SimulationConfig
    from simulation.report import report_markdown_table, report_write, summarise

    config = SimulationConfig(hosts=HOSTS, pools=POOLS, hosts_per_domain=DOMAIN, days=days, policies=(*TRAINS, *PEERS))
    summary = summarise(config, runs)
    report_write(ROOT / "var" / "bench-simulate", config, runs)
    if days == 30.0:
        path = ROOT / "BENCHMARKS.md"
        text = path.read_text()
        if START in text and END in text:
            table = report_markdown_table(summary)
            before, rest = text.split(START, 1)
            path.write_text(f"{before}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")
    return summary
