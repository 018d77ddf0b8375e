"""One process of the invariant stress test (issue 8): `python -m tests.stress_actor --seed N --seconds S`.

Until its deadline it does what many integrations and schedulers do at once, at random: submits
overlapping reboots, verifications and upgrades over random hosts (some gang, some cancelled), reports
hosts broken in service, ticks random pools and runs the simulated drainer and executor. Several of
these run side by side against the same database; the test process checks the invariants meanwhile.
Prints one JSON line of counts when done. Expects DATABASE_URL to point at the test database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from collections import Counter

# Upgrades the submitter picks from: all keep the hosts compatible except the 535 driver, which
# submission must refuse (the catalogue of tests.builders.make_fleet).
UPGRADES = [
    ("gpu-driver", "550.127.05"),
    ("gpu-driver", "560.35.03"),
    ("bios", "2.14.0"),
    ("bios", "2.16.0"),
]
INCOMPATIBLE = ("gpu-driver", "535.183.01")
MAX_UNEXPECTED = 20  # an actor that keeps failing stops early and reports what it saw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stress_actor")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--backlog", type=int, default=2, help="pending tasks allowed per host of a pool")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    counts, unexpected = run(seed=args.seed, seconds=args.seconds, backlog=args.backlog)
    print(json.dumps({"seed": args.seed, "counts": counts, "unexpected": unexpected}), flush=True)
    return 0


def run(*, seed: int, seconds: float, backlog: int) -> tuple[dict[str, int], list[str]]:
    from django.core.exceptions import ValidationError
    from django.db import connection

    from fleet.models import Host, HostState, Pool
    from opsplanner.models import HostTask, OperationState, TaskState
    from opsplanner.services.failures import host_failure_report
    from opsplanner.services.operation_cancel import operation_cancel
    from opsplanner.services.operations import operation_submit
    from opsplanner.services.simulator import simulated_work_step
    from opsplanner.services.tick import pool_tick

    rng = random.Random(seed)
    pools = list(Pool.objects.order_by("pk"))
    hostnames = {pool.pk: list(Host.objects.filter(pool=pool).values_list("hostname", flat=True)) for pool in pools}
    host_ids = list(Host.objects.values_list("pk", flat=True))
    planned = {pool.pk: pool.buffers_for(len(hostnames[pool.pk])).planned for pool in pools}
    counts: Counter[str] = Counter()
    unexpected: list[str] = []
    mine: list[int] = []  # this actor's operations, for cancelling a few later

    def submit() -> None:
        pool = rng.choice(pools)
        pending = HostTask.objects.filter(pool_id=pool.pk, state=TaskState.PENDING).count()
        if pending >= backlog * len(hostnames[pool.pk]):
            counts["submit_throttled"] += 1  # keep the backlog bounded so the final drain ends
            return
        gang = rng.random() < 0.2
        size = rng.randint(2, min(8, planned[pool.pk])) if gang else rng.randint(1, 12)
        chosen = rng.sample(hostnames[pool.pk], size)
        if not gang and rng.random() < 0.1:
            other = rng.choice(pools)  # a scope across two pools, admitted by each pool's tick
            chosen = sorted({*chosen, *rng.sample(hostnames[other.pk], 2)})
        kind = rng.choice(["reboot", "verification", "upgrade"])
        component = version = ""
        if kind == "upgrade":
            component, version = INCOMPATIBLE if rng.random() < 0.03 else rng.choice(UPGRADES)
        try:
            operation = operation_submit(
                kind=kind,
                scope="hosts: " + ", ".join(chosen),
                reason=f"stress actor {seed}",
                component=component,
                version=version,
                priority=rng.randint(0, 1000),
                gang=gang,
            )
        except ValidationError:
            counts["submit_refused"] += 1  # the incompatible driver, by design
            return
        counts["operations_submitted"] += 1
        counts["host_tasks_submitted"] += len(chosen)
        mine.append(operation.pk)
        if rng.random() < 0.05:
            cancel(operation.pk)  # at once, before any tick saw it

    def cancel(operation_id: int) -> None:
        try:
            counts["tasks_cancelled"] += operation_cancel(operation_id=operation_id, reason="stress: changed my mind")
            counts["cancels"] += 1
        except ValidationError:
            counts["cancel_refused"] += 1  # already closed: the race is the point

    def cancel_an_older_one() -> None:
        if mine:
            operation_id = rng.choice(mine[-50:])
            from opsplanner.models import Operation

            if Operation.objects.filter(pk=operation_id, state=OperationState.OPEN).exists():
                cancel(operation_id)

    def break_a_host() -> None:
        host_id = rng.choice(host_ids)
        if not Host.objects.filter(pk=host_id, state=HostState.IN_SERVICE).exists():
            return
        try:
            host_failure_report(host_id=host_id, reason=f"stress actor {seed}: ECC errors")
            counts["hosts_broken"] += 1
        except ValidationError:
            counts["break_refused"] += 1  # taken by an operation meanwhile

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(unexpected) < MAX_UNEXPECTED:
        roll = rng.random()
        try:
            if roll < 0.6:
                submit()
            elif roll < 0.65:
                cancel_an_older_one()
            elif roll < 0.655:
                break_a_host()
            report = pool_tick(pool_id=rng.choice(pools).pk)
            counts["ticks_skipped" if report.skipped else "ticks_rolled_back" if report.retried else "ticks"] += 1
            if report.skipped or rng.random() < 0.5:  # three actors run the simulator: every other round will do
                counts["items_finished"] += simulated_work_step()
        except Exception:  # noqa: BLE001 - anything but a refusal is reported to the test, which fails on it
            unexpected.append(traceback.format_exc(limit=8))
            connection.close()  # a broken connection must not poison the next round
    connection.close()
    return dict(counts), unexpected


if __name__ == "__main__":
    sys.exit(main())
