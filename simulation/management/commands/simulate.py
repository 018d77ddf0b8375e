"""python manage.py simulate: the real planner in virtual time, policies side by side, a report.

    manage.py simulate --hosts 10000 --pools 10 --days 30 --policies trains,rolling,lockstep
    manage.py simulate --advise --hosts 1000 --domain-sizes 10,25,50,100 --interruption-cost 50
    manage.py simulate --scenario meta --hosts 10000 --pools 10 --days 30 --policies trains,rolling
    manage.py simulate --from-live --pool gpu-east --days 7   (what the live pool's pending work does)

Each run happens in scratch databases (never the live one); see simulation/runner.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from opsplanner.progress import Progress
from simulation.advisor import AdvisorRequest, advice, advice_svg
from simulation.config import POLICIES, SimulationConfig, config_fields
from simulation.runner import (
    Job,
    ScratchLaneError,
    ShardFailed,
    default_lanes,
    jobs_run,
    lanes_claimed,
    scratch_databases,
    scratch_databases_drop,
    scratch_databases_swept,
    shard_jobs,
    shards_missing,
)
from simulation.scenarios import SCENARIOS, scenario_config, scenario_describe

CLI_TAGS = r"_cli(?:run|advise)\d+"  # the tags of the command line's own lanes (a regular expression)

# Set by the what-if on the live fleet, never on the command line.
INTERNAL_FIELDS = ("live_snapshot", "start_at", "planned_buffer_size")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"{text!r} is not a comma-separated list of whole numbers") from None


class Command(BaseCommand):
    help = "Simulate maintenance policies over a generated fleet in virtual time and report what each costs."

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = SimulationConfig()
        # No parser defaults for the knobs: a scenario fills in what the command line leaves out.
        for field in config_fields():
            if field.name in INTERNAL_FIELDS:
                continue
            option = "--" + field.name.replace("_", "-")
            default = getattr(defaults, field.name)
            if field.name == "policies":
                parser.add_argument(option, default=None, help=f"some of {', '.join(POLICIES)} (default trains)")
            elif field.name == "rolling_concurrency":
                parser.add_argument(option, type=int, default=None, help="hosts at once (default: the planned buffer)")
            elif field.name == "scenario":
                parser.add_argument(option, default="default", help="; ".join(map(scenario_describe, SCENARIOS)))
            else:
                parser.add_argument(option, type=type(default), default=None, help=f"default {default}")
        parser.add_argument("--lanes", type=int, default=default_lanes(), help="processes in parallel")
        parser.add_argument("--out", type=Path, default=None, help="report directory (default var/simulations/…)")
        parser.add_argument(
            "--keep-databases",
            action="store_true",
            help="keep the scratch databases afterwards (until the next run of the same kind drops them)",
        )
        parser.add_argument(
            "--work-dir",
            type=Path,
            default=None,
            help="keep each shard's result here, and reuse those an earlier run with the same configuration and "
            "code left (an interrupted run resumes)",
        )
        parser.add_argument("--advise", action="store_true", help="sweep domain sizes for one pool of --hosts")
        parser.add_argument("--domain-sizes", default="10,25,50,100", help="advisor: sizes to try")
        parser.add_argument("--interruption-cost", type=float, default=100.0, help="advisor: cost of one interruption")
        parser.add_argument("--capacity-hour-cost", type=float, default=1.0, help="advisor: cost of a host-hour")
        parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
        parser.add_argument(
            "--from-live", action="store_true", help="forecast the live fleet's pending work over --days, each policy"
        )
        parser.add_argument("--pool", default=None, help="--from-live: only this pool")
        # Internal: one shard of one policy, in a scratch database (the runner starts these).
        parser.add_argument("--shard", default=None, help="(internal)")
        parser.add_argument("--shard-pools", default="", help="(internal)")
        parser.add_argument("--config-json", default="", help="(internal)")
        parser.add_argument("--result", type=Path, default=None, help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["shard"]:
            return self._shard(options)
        config = self._config(options)
        lanes = options["lanes"]
        if not 1 <= lanes <= 16:
            raise CommandError("--lanes must be from 1 to 16")
        out = options["out"] or Path(settings.VAR_DIR) / "simulations" / time.strftime("%Y%m%d-%H%M%S")
        # Usable before any shard starts, not found wrong after the whole run.
        for option in ("work_dir", "out"):
            if options[option] is not None:
                _directory_made(f"--{option.replace('_', '-')}", options[option])
        with sigterm_exits():
            if options["advise"]:
                return self._advise(config, options, lanes, out)
            if options.get("from_live"):
                return self._from_live(config, options, lanes, out)
            return self._simulate(config, options, lanes, out)

    def _config(self, options: dict[str, Any]) -> SimulationConfig:
        values: dict[str, Any] = {}
        for field in config_fields():
            value = options.get(field.name)
            if field.name in INTERNAL_FIELDS or field.name == "scenario" or value is None:
                continue
            if field.name == "policies":
                value = tuple(p.strip() for p in value.split(",") if p.strip())
            values[field.name] = value
        scenario = options.get("scenario") or "default"
        if options.get("pool") and not options.get("from_live"):
            raise CommandError("--pool: only with --from-live")
        if options.get("from_live"):
            if options.get("advise"):
                raise CommandError("--from-live: not with --advise")
            if options.get("upgrades_per_week") or options.get("upgrades_at_start"):
                raise CommandError("--from-live forecasts the live pending upgrades; new arrivals do not apply")
            if options.get("work_dir") is not None:  # a snapshot is of now: a later run resumes nothing
                raise CommandError(
                    "--work-dir: not with --from-live, whose forecast starts from the fleet as it is now"
                )
            if options.get("pool") is not None:
                options["pool"] = options["pool"].strip() or None  # as the API and the form take it
            from simulation.from_live import LIVE_FIXED, LIVE_POOL_FIELDS

            # Judged against the generated fleet they would name a fleet that does not exist, and a
            # valid one would be dropped without a word (live_config takes them from the live pool).
            # The SLO only where the live pool has a train (live_config): one without has its trains at it.
            shape = LIVE_POOL_FIELDS - {"cycle_slo_hours", *INTERNAL_FIELDS}
            taken = sorted(name for name in shape if name in values)
            if taken:
                given = ", ".join(f"--{name.replace('_', '-')}" for name in taken)
                raise CommandError(f"{given}: not with --from-live, which takes the pool's shape from the live pool")
            values = {"policies": POLICIES, **values, **LIVE_FIXED}
        if scenario not in SCENARIOS:
            raise CommandError(f"--scenario: one of {', '.join(SCENARIOS)}; got {scenario!r}")
        config = scenario_config(scenario, **values)
        if options["advise"]:  # --hosts is the one pool's size
            config = config.replace(pools=1, policies=("trains",))
        problems = config.errors()
        if problems and not options["advise"]:
            raise CommandError("; ".join(f"--{k.replace('_', '-')}: {v}" for k, v in problems.items()))
        return config

    def _simulate(self, config: SimulationConfig, options: dict[str, Any], lanes: int, out: Path) -> None:
        from simulation.report import report_text, report_write

        started = time.monotonic()
        say = self._say
        say(f"simulate: {config.hosts:,} hosts in {config.pools} pools, {config.days:g} days, policies "
            f"{', '.join(config.policies)}, scenario {config.scenario}")  # fmt: skip
        runs = self._jobs_run(shard_jobs(config), options, lanes)
        paths = report_write(out, config, runs)
        summary = json.loads(paths["summary.json"].read_text())
        self.stdout.write(json.dumps(summary, indent=1) if options["json"] else report_text(summary))
        say(f"simulate: done in {time.monotonic() - started:.0f} s; report in {out}")

    def _jobs_run(
        self, jobs: list[Job], options: dict[str, Any], lanes: int, *, kind: str = "run"
    ) -> dict[str, list[dict[str, Any]]]:
        """Run the jobs on scratch lanes, in --work-dir if given (reusing the shards an earlier run
        finished there), else in a directory that goes with the run. The lanes are this process's own
        and claimed while it runs, as a what-if's are (a second run at once dropped the first's lanes
        under it); the next run drops those a killed run left."""
        tag = f"_cli{kind}{os.getpid()}"
        with lanes_claimed(tag):
            swept = scratch_databases_swept(CLI_TAGS)
            if swept:
                self._say(f"simulate: dropped the lanes no run holds (killed or kept): {', '.join(swept)}")
            return self._jobs_run_in_lanes(jobs, options, lanes, tag=tag)

    def _jobs_run_in_lanes(
        self, jobs: list[Job], options: dict[str, Any], lanes: int, *, tag: str
    ) -> dict[str, list[dict[str, Any]]]:
        work_dir: Path | None = options["work_dir"]
        to_run = jobs if work_dir is None else shards_missing(jobs, work_dir)
        lanes = min(lanes, len(to_run))
        if len(to_run) < len(jobs):
            self._say(f"simulate: {len(jobs) - len(to_run)} of {len(jobs)} shards kept in {work_dir}")
        if to_run:
            self._say(f"simulate: {len(to_run)} shards to run, {lanes} at a time")
        try:
            urls = scratch_databases(lanes, tag=tag) if lanes else []
        except ScratchLaneError as error:
            raise CommandError(f"simulate: {error}") from None
        try:
            with _work_directory(work_dir) as work:
                return jobs_run(jobs, urls, work, reuse=work_dir is not None, say=self._say)
        except ShardFailed as error:
            raise CommandError(f"simulate: {error}") from None
        finally:
            if not options["keep_databases"]:
                scratch_databases_drop(urls)

    def _from_live(self, config: SimulationConfig, options: dict[str, Any], lanes: int, out: Path) -> None:
        from simulation.from_live import LIVE_POOL_FIELDS, LiveConfigError, LiveSnapshotError, live_forecast
        from simulation.report import report_text, report_write

        started = time.monotonic()
        try:
            forecast = live_forecast(
                config, options.get("pool"), lanes=lanes, keep_databases=options["keep_databases"], say=self._say
            )
        except LiveConfigError as error:  # an option named only where the user gave it and the pool did not
            given = {k for k in error.problems if options.get(k) is not None and k not in LIVE_POOL_FIELDS}
            names = {k: "--" + k.replace("_", "-") if k in given else k.replace("_", " ") for k in error.problems}
            raise CommandError(
                f"--from-live: pool {error.pool}: " + "; ".join(f"{names[k]}: {v}" for k, v in error.problems.items())
            ) from None
        except LiveSnapshotError as error:
            raise CommandError(f"--from-live: {error}") from None
        except (ShardFailed, ScratchLaneError) as error:  # a shard's own error is on the standard error
            raise CommandError(f"--from-live: {error}") from None
        paths = report_write(out, forecast.config, forecast.runs)
        summary = json.loads(paths["summary.json"].read_text())
        self.stdout.write(json.dumps(summary, indent=1) if options["json"] else report_text(summary))
        self._say(f"simulate: forecast done in {time.monotonic() - started:.0f} s; report in {out}")

    def _advise(self, config: SimulationConfig, options: dict[str, Any], lanes: int, out: Path) -> None:
        request = AdvisorRequest(
            config=config,
            sizes=_ints(options["domain_sizes"]),
            interruption_cost=options["interruption_cost"],
            capacity_hour_cost=options["capacity_hour_cost"],
        )
        problems = request.errors()
        if problems:
            raise CommandError("; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in problems.items()))
        started = time.monotonic()
        results = self._jobs_run(request.jobs(), options, lanes, kind="advise")
        result = advice(request, results)
        out.mkdir(parents=True, exist_ok=True)
        (out / "advice.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        (out / "advice.svg").write_text(advice_svg(result))
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=1, sort_keys=True))
        else:
            self.stdout.write(advice_text(result))
        self._say(f"simulate: advice in {time.monotonic() - started:.0f} s; written to {out}")

    def _shard(self, options: dict[str, Any]) -> None:
        from simulation.engine import SimulationError, policy_run
        from simulation.measure import run_measure
        from simulation.world import workload_draw

        raw = json.loads(options["config_json"])
        raw["policies"] = tuple(raw["policies"])
        config = SimulationConfig(**raw)
        pools = list(_ints(options["shard_pools"]))
        label = f"simulate[{options['shard']} pools {options['shard_pools']}]"
        try:
            log = policy_run(
                config, workload_draw(config), options["shard"], pools=pools, progress=Progress(label, interval=5)
            )
        except SimulationError as error:
            raise CommandError(str(error)) from error
        # Written whole or not at all: a run resuming from --work-dir reuses what it finds there.
        part = options["result"].with_name(options["result"].name + ".part")
        part.write_text(json.dumps(run_measure(config, log)))
        os.replace(part, options["result"])

    def _say(self, message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _directory_made(option: str, path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file of that name, no permission, ...
        raise CommandError(f"{option}: cannot use {path}: {error.strerror}") from None


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM (a service manager stopping the run, a timeout's kill) ends the run as Ctrl-C would: by an
    exception, so the `finally` blocks stop the shards and drop the scratch lanes. Python's default
    ends the process at once, leaving both behind. Only the main thread can take a signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _work_directory(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None:  # made by handle()
        yield work_dir
        return
    with tempfile.TemporaryDirectory() as work:
        yield Path(work)


def advice_text(result: dict[str, Any]) -> str:
    lines = [
        f"Domain-size advice for a pool of {result['pool_hosts']} hosts, per {result['cycle_slo_hours']:g} h cycle "
        f"(interruption {result['interruption_cost']:g}, host-hour {result['capacity_hour_cost']:g})",
        "",
        f"{'size':>6} {'domains':>8} {'interrupted':>12} {'buffer h':>10} {'stranded h':>11} {'worst cycle h':>14} "
        f"{'missed':>7} {'cost':>12}",
    ]
    for p in result["points"]:
        if p["cost"] is None:
            lines.append(f"{p['size']:>6} {p['domains']:>8}  not simulated: {p['why']}")
            continue
        worst = "—" if p["worst_cycle_hours"] is None else f"{p['worst_cycle_hours']:.1f}"
        lines.append(
            f"{p['size']:>6} {p['domains']:>8} {p['interrupted_jobs']:>12} {p['buffer_host_hours']:>10.0f} "
            f"{p['stranded_host_hours']:>11.0f} {worst:>14} {p['cycles_missed']:>7} {p['cost']:>12.1f}"
        )
    if result["recommended"] is None:
        lines += ["", f"no recommendation: {result['reason']}", ""]
    else:
        lines += ["", f"recommended: {result['recommended']} hosts per domain ({result['reason']})", ""]
    return "\n".join(lines)
