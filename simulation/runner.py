"""Running a simulation safely and in parallel: scratch databases, lanes, shards.

A simulation empties and rewrites the product tables, so it never runs in the live database:
each lane is a scratch database next to it (`<name>_<lane>_sim` on PostgreSQL, a file under
var/sim/ on SQLite), migrated once per simulation. Pools are independent in a simulation (one train
or controller per pool), so each policy's pools run one by one as separate `manage.py simulate
--shard` processes, as many at once as there are lanes, and their measures are merged afterwards.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
from django.conf import settings
from django.db import connection

from simulation.config import SimulationConfig

ROOT = Path(__file__).resolve().parent.parent
LANE_RANDOM_PAGE_COST = 1.1
LANE_STATISTICS_TARGET = 10


@dataclass(frozen=True)
class Job:
    policy: str
    pools: tuple[int, ...]
    config: SimulationConfig
    key: str  # names the result (a policy, or a domain size for the advisor)


POSTGRESQL_NAME_BYTES = 63  # PostgreSQL cuts longer names: two lanes' names would then collide


class ScratchLaneError(RuntimeError):
    """The scratch lanes cannot be made here; the message says why, in one line."""


class ShardFailed(RuntimeError):
    """A shard's process ended with an error; it wrote its own message on the standard error it shares,
    whose last line (`last_line`, empty if it wrote none) the message repeats, so a stored reason says why."""

    def __init__(self, job: Job, returncode: int, last_line: str = "") -> None:
        self.job, self.returncode, self.last_line = job, returncode, last_line
        ended = f"was killed by signal {-returncode}" if returncode < 0 else f"failed with exit {returncode}"
        why = f": {last_line}" if last_line else "; its own error is above, on the standard error"
        super().__init__(f"the {job.key} shard ({job.policy}, pools {_pools_text(job)}) {ended}{why}")


def default_lanes() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def shard_jobs(config: SimulationConfig, *, key: str = "") -> list[Job]:
    """One job per policy and pool. Each pool runs alone in a freshly reset database, so its ids,
    and with them the simulated outcomes, do not depend on how many lanes run the jobs."""
    return [
        Job(policy=p, pools=(n,), config=config, key=key or p) for p in config.policies for n in range(config.pools)
    ]


def sibling_database_url(name: str) -> str:
    """The URL of database `name` on the default database's server, as its user (a SQLite path)."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{name}"
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    return f"postgresql://{auth}@{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{name}"


def scratch_databases(lanes: int, *, tag: str = "") -> list[str]:
    """Create `lanes` migrated scratch databases (replacing any of the same name); their URLs. If making
    them fails half-way, those made are dropped before the error goes up: the caller has no URL to drop."""
    db = settings.DATABASES["default"]
    sqlite = db["ENGINE"].endswith("sqlite3")
    base = Path(str(db["NAME"])).stem if sqlite else str(db["NAME"])
    names = [f"{base}{tag}_{lane}_sim" for lane in range(lanes)]
    longest = max(names, key=lambda name: len(name.encode()), default="")
    if not sqlite and len(longest.encode()) > POSTGRESQL_NAME_BYTES:
        room = POSTGRESQL_NAME_BYTES - (len(longest.encode()) - len(base.encode()))
        raise ScratchLaneError(
            f"the database name {base!r} is too long for the simulator's scratch lanes: {longest!r} would be "
            f"{len(longest.encode())} bytes, PostgreSQL keeps {POSTGRESQL_NAME_BYTES} (a name of at most {room} "
            "bytes leaves room)"
        )
    if sqlite:
        names = [str(Path(settings.VAR_DIR) / "sim" / f"{name}.sqlite3") for name in names]
    urls = [sibling_database_url(name) for name in names]
    try:
        (_sqlite_lanes_make if sqlite else _postgresql_lanes_make)(names)
    except BaseException:
        scratch_databases_drop(urls)
        raise
    return urls


def _sqlite_lanes_make(paths: list[str]) -> None:
    Path(paths[0]).parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        Path(path).unlink(missing_ok=True)
    _migrate(sibling_database_url(paths[0]))
    for path in paths[1:]:
        shutil.copyfile(paths[0], path)


def _postgresql_lanes_make(names: list[str]) -> None:
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cursor.execute(f'CREATE DATABASE "{names[0]}"')
    _migrate(sibling_database_url(names[0]))
    _scratch_tables_tuned(names[0])
    with connection.cursor() as cursor:
        for name in names[1:]:  # a copy of the migrated first lane, much faster than migrating again
            cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{names[0]}"')
        for name in names:
            # Nothing here outlives the run: a crash loses a shard, which fails and says so.
            cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
            # A lane lives in memory (unlogged, a few hundred MB): an index probe costs about what a
            # page read in sequence does. At PostgreSQL's default (4, for spinning disks) the train
            # tick's count of phase successes scanned every finished task for each phase it counted,
            # 67 ms for 52 upgrades at day 20 of a 1,000-host meta run; 20 ms through the index.
            cursor.execute(f'ALTER DATABASE "{name}" SET random_page_cost = {LANE_RANDOM_PAGE_COST}')
            # The lane's daily ANALYZE (lane_vacuum) samples 300 rows per unit of this target from each
            # table; at PostgreSQL's default (100) it was most of the vacuum's cost, 4% of a 30-day meta
            # run. The columns it describes hold a few states each, which ten buckets keep whole.
            cursor.execute(f'ALTER DATABASE "{name}" SET default_statistics_target = {LANE_STATISTICS_TARGET}')


# Every table of a scratch database UNLOGGED (no write-ahead log: the simulator writes hundreds of
# thousands of rows it throws away). A table can only turn unlogged after the tables whose foreign
# keys point at it, so the loop goes round until nothing more changes.
_ALL_TABLES_UNLOGGED = """
DO $$
DECLARE table_name regclass; changed boolean;
BEGIN
  LOOP
    changed := false;
    FOR table_name IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relpersistence = 'p' LOOP
      BEGIN
        EXECUTE format('ALTER TABLE %s SET UNLOGGED', table_name);
        changed := true;
      EXCEPTION WHEN feature_not_supported OR invalid_table_definition OR object_not_in_prerequisite_state THEN
        NULL;  -- still referenced by a logged table: next round
      END;
    END LOOP;
    EXIT WHEN NOT changed;
  END LOOP;
END $$
"""


# No statistics on the JSON and free-text columns of a scratch database: the lane vacuum's ANALYZE
# spent most of its time sampling them (the events' data and reasons, the work items' params and
# results: 0.43 of 0.53 s at day 10 of a 1,000-host meta run, every 6 simulated hours), and no query
# of the product filters on them in a way their statistics inform (a JSON key's test is estimated
# without them, and nothing filters on a reason's text).
_FREE_TEXT_STATISTICS_OFF = """
DO $$
DECLARE col record;
BEGIN
  FOR col IN SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = current_schema() AND data_type IN ('jsonb', 'text') LOOP
    EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET STATISTICS 0', col.table_name, col.column_name);
  END LOOP;
END $$
"""


def _scratch_tables_tuned(name: str) -> None:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        dbname=name, user=db.get("USER") or None, password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None, port=db.get("PORT") or None, autocommit=True,
    ) as scratch:  # fmt: skip
        scratch.execute(_ALL_TABLES_UNLOGGED)
        scratch.execute(_FREE_TEXT_STATISTICS_OFF)
        logged = scratch.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relpersistence = 'p'"
        ).fetchone()
    if logged and logged[0]:
        raise RuntimeError(f"{logged[0]} tables of scratch database {name} could not be made unlogged")


def lane_analyze() -> None:
    """Refresh the planner's statistics of the lane's tables (on the current connection, a scratch
    database): autovacuum may be off, and a month of simulated work leaves tables of millions of rows
    the planner still thinks empty; the end-of-run invariant check then took minutes instead of seconds.
    Call it before `check_invariants` at the end of a run."""
    from simulation.engine import scratch_database_check

    scratch_database_check()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def lane_vacuum(*, analyze: bool = True) -> None:
    """Reclaim the dead rows of the lane's tables and refresh their statistics, as autovacuum would
    (on PostgreSQL; the engine calls it every few simulated hours). Autovacuum may be off, as on this
    project's machines, and the simulated work updates the same rows thousands of times: a 10-day run
    left its 1,000 hosts' table with 15 dead row versions per live one, which every scan of hosts
    read through, and the planner planned on empty tables. Inside a transaction (a test's), where
    PostgreSQL cannot vacuum, it only analyzes.

    `analyze=False` only vacuums, which also keeps the planner's row counts current: the statistics
    of the columns are what cost (sampling 30,000 rows of each large table: 0.6 s of the 0.65 s a
    vacuum took at day 30 of a 1,000-host meta run, growing with the run), and the shares they
    describe move slowly; the engine refreshes them once a simulated day."""
    from simulation.engine import scratch_database_check

    scratch_database_check()
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if analyze:
            cursor.execute("ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)")
        elif not connection.in_atomic_block:
            cursor.execute(f"VACUUM {', '.join(connection.ops.quote_name(t) for t in lane_tables())}")


def lane_tables() -> list[str]:
    """Every table of the product's apps (fleet, core, trains): what a lane holds."""
    from django.apps import apps

    return [
        model._meta.db_table
        for app in ("fleet", "opsplanner", "trains")
        for model in apps.get_app_config(app).get_models(include_auto_created=True)
    ]


def scratch_databases_drop(urls: list[str]) -> None:
    for url in urls:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
            continue
        name = url.rsplit("/", 1)[-1]
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scratch_databases_drop_tagged(tag: str) -> list[str]:
    """Drop every scratch database made with `tag` (what a killed run left behind); their names.
    Runs outside a transaction (PostgreSQL drops databases only there)."""
    db = settings.DATABASES["default"]
    sqlite = db["ENGINE"].endswith("sqlite3")
    base = Path(str(db["NAME"])).stem if sqlite else str(db["NAME"])
    lane = re.compile(rf"{re.escape(base + tag)}_\d+_sim")
    if sqlite:
        paths = [p for p in (Path(settings.VAR_DIR) / "sim").glob("*_sim.sqlite3") if lane.fullmatch(p.stem)]
        for path in paths:
            path.unlink(missing_ok=True)
        return sorted(path.stem for path in paths)
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database")
        names = sorted(name for (name,) in cursor.fetchall() if lane.fullmatch(name))
        for name in names:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return names


_LANE_LOCK_SPACE = 0x4F50_4C4E  # the first key of the lane claims' advisory locks (the second: the tag's hash)


def _own_connection() -> psycopg.Connection[Any]:
    return psycopg.connect(**connection.get_connection_params(), autocommit=True)


@contextmanager
def lanes_claimed(tag: str) -> Iterator[None]:
    """Claim the scratch databases tagged `tag` while the block runs: a PostgreSQL session advisory lock
    on a connection of its own, which dies with the process, so `scratch_databases_swept` tells the
    lanes of a killed run (nobody claims them) from those of a live one. Nothing to claim under SQLite."""
    if connection.vendor != "postgresql":
        yield
        return
    with _own_connection() as claim:
        claim.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [_LANE_LOCK_SPACE, tag])
        yield  # closing the connection releases the claim


def scratch_databases_swept(tag_pattern: str) -> list[str]:
    """Drop the scratch databases whose tag matches `tag_pattern` (a regular expression) that no live
    run claims (lanes_claimed): what killed runs left behind. Their names. PostgreSQL only."""
    if connection.vendor != "postgresql":
        return []
    lane = re.compile(rf"{re.escape(str(settings.DATABASES['default']['NAME']))}({tag_pattern})_\d+_sim")
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database")
        tags = sorted({m.group(1) for (name,) in cursor.fetchall() if (m := lane.fullmatch(name))})
    dropped: list[str] = []
    with _own_connection() as probe:
        for tag in tags:
            row = probe.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [_LANE_LOCK_SPACE, tag]).fetchone()
            if not (row and row[0]):
                continue  # a live run's
            try:
                dropped += scratch_databases_drop_tagged(tag)
            finally:
                probe.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [_LANE_LOCK_SPACE, tag])
    return dropped


def _child_env(database_url: str) -> dict[str, str]:
    # DEBUG off: Django would otherwise keep every query of a month-long run in memory.
    return dict(
        os.environ,
        DATABASE_URL=database_url,
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(40),
        LOG_FORMAT="text",
        PYTHONUNBUFFERED="1",
    )


def _migrate(database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=_child_env(database_url),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrating the scratch database failed:\n{result.stderr[-2000:]}")


def shard_result_name(job: Job) -> str:
    """The file of a job's result in a work directory, named by all that decides the result: the
    configuration but for its list of policies (a shard runs one), the policy, the pools, the key and
    the code. A rerun given the same directory so reuses exactly the shards it would compute again."""
    decided = {name: value for name, value in job.config.as_dict().items() if name != "policies"}
    decided.update(policy=job.policy, pools=list(job.pools), key=job.key, code=code_revision())
    digest = hashlib.sha256(json.dumps(decided, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"shard-{re.sub(r'[^A-Za-z0-9.-]+', '_', job.key)}-{digest}.json"


@functools.cache
def code_revision() -> str:
    """The checkout's commit, with a digest of its uncommitted changes if any; "unknown" outside git
    (shards are then reused by their configuration alone)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    try:
        revision, changes = git("rev-parse", "HEAD").strip(), git("diff", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{revision}+{hashlib.sha256(changes.encode()).hexdigest()[:12]}" if changes else revision


def _result_read(path: Path) -> dict[str, Any] | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or unreadable: run again
        return None
    return result if isinstance(result, dict) else None


def shards_missing(jobs: list[Job], work_dir: Path) -> list[Job]:
    """The jobs whose result an earlier run did not leave in `work_dir`."""
    return [job for job in jobs if _result_read(work_dir / shard_result_name(job)) is None]


def jobs_run(
    jobs: list[Job],
    lanes: list[str],
    work_dir: Path,
    *,
    reuse: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run the jobs, one per lane at a time; {job key: [shard results, in job order]}. A failed shard
    stops the run. With `reuse`, a job whose result an earlier run left in `work_dir` is not run again
    (an interrupted simulation resumes where it stopped)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    done: dict[int, dict[str, Any]] = {}
    pending: list[tuple[int, Job, Path]] = []
    for number, job in enumerate(jobs):
        path = work_dir / shard_result_name(job)
        kept = _result_read(path) if reuse else None
        if kept is None:
            pending.append((number, job, path))
        else:
            done[number] = kept
            say(f"simulate: {job.key} ({job.policy}), pools {_pools_text(job)}: kept from an earlier run")
    if pending and not lanes:
        raise ValueError("jobs to run but no lane to run them in")
    running: dict[int, tuple[subprocess.Popen[bytes], int, Job, Path, float, _StderrRelay]] = {}
    try:
        while pending or running:
            free = [lane for lane in range(len(lanes)) if lane not in running]
            while free and pending:
                lane = free.pop(0)
                number, job, result_path = pending.pop(0)
                command = [
                    sys.executable, "manage.py", "simulate", "--shard", job.policy,
                    "--shard-pools", ",".join(map(str, job.pools)), "--config-json", json.dumps(job.config.as_dict()),
                    "--result", str(result_path),
                ]  # fmt: skip
                say(f"simulate: lane {lane}: {job.key} ({job.policy}), pools {_pools_text(job)}")
                process = subprocess.Popen(command, cwd=ROOT, env=_child_env(lanes[lane]), stderr=subprocess.PIPE)
                running[lane] = (process, number, job, result_path, time.monotonic(), _StderrRelay(process))
            time.sleep(0.2)
            for lane, (process, number, job, result_path, started, relay) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[lane]
                if process.returncode != 0:
                    raise ShardFailed(job, process.returncode, relay.last_line())
                done[number] = json.loads(result_path.read_text())
                say(f"simulate: lane {lane}: {job.key} done in {time.monotonic() - started:.0f} s")
    finally:  # a failed shard, an interrupt, a SIGTERM (the command makes it SystemExit): no shard outlives the run
        for process, *_ in running.values():
            process.kill()
        for process, *_ in running.values():
            process.wait()
    results: dict[str, list[dict[str, Any]]] = {}
    for number, job in enumerate(jobs):
        results.setdefault(job.key, []).append(done[number])
    return results


# How long `last_line` waits, after the shard's process ended, for the pipe of its standard error to
# close. It closes once every writer did: at once, unless a grandchild the shard left holds it open.
RELAY_DRAIN_SECONDS = 60.0


class _StderrRelay:
    """Passes a shard's standard error on to ours as it comes (its progress and its error stay where
    they were), keeping its last line for ShardFailed."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._last = ""
        self._thread = threading.Thread(target=self._relay, args=(process.stderr,), daemon=True)
        self._thread.start()

    def _relay(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        for raw in stream:
            line = raw.decode(errors="replace")
            if line.strip():  # kept before it is passed on: our own stderr may be slow to take it
                self._last = line.strip()
            sys.stderr.write(line)
            sys.stderr.flush()

    def last_line(self) -> str:
        """The shard's last line, once its process has ended. Waits for the relay to reach the end of
        the pipe rather than a few seconds: a relay lagging behind the exit (a loaded machine, a slow
        stderr) lost the shard's own error. A grandchild holding the pipe costs the bound, no hang."""
        self._thread.join(timeout=RELAY_DRAIN_SECONDS)
        return self._last[:500]


def _pools_text(job: Job) -> str:
    return ", ".join(map(str, job.pools))
