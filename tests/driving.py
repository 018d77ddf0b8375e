"""Driving the orchestration core in-process: ticks and the simulated adapters, round by round."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from django.db import connection

from fleet.models import Pool
from opsplanner.models import OPEN_TASK_STATES, HostTask, SimulatorProfile, WorkItem, WorkState
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.simulator import simulated_work_step, simulator_profile_instant
from opsplanner.services.tick import pool_tick

ACTIVE = list(OPEN_TASK_STATES)


def instant_simulator(**overrides: object) -> SimulatorProfile:
    return simulator_profile_instant(**overrides)


def busy(pools: Iterable[Pool]) -> bool:
    ids = [pool.pk for pool in pools]
    return (
        HostTask.objects.filter(pool_id__in=ids, state__in=ACTIVE).exists()
        or WorkItem.objects.filter(pool_id__in=ids, state__in=[WorkState.READY, WorkState.RUNNING]).exists()
        or WorkItem.objects.filter(pool_id__in=ids, consumed_at__isnull=True, state__in=["done", "failed"]).exists()
    )


def drive(
    *pools: Pool,
    max_rounds: int = 200,
    each_round: Callable[[], None] | None = None,
    until: Callable[[], bool] | None = None,
    check: bool = True,
) -> int:
    """Tick the pools and run the simulator until nothing is left to do (or `until` holds).
    With check, the invariants are verified after every round."""
    for round_number in range(1, max_rounds + 1):
        for pool in pools:
            pool_tick(pool_id=pool.pk)
        simulated_work_step()
        if check:
            violations = check_invariants()
            assert not violations, f"round {round_number}: {violations}"
        if each_round:
            each_round()
        if until() if until else not busy(pools):
            return round_number
    stuck = list(
        HostTask.objects.filter(state__in=ACTIVE).values_list("id", "state", "host__state", "waiting_reason")[:10]
    )
    items = list(
        WorkItem.objects.filter(host_task_id__in=[row[0] for row in stuck]).values_list(
            "host_task_id", "kind", "state", "consumed_at", "claimed_by", "due_at"
        )
    )
    raise AssertionError(f"not settled after {max_rounds} rounds; still active: {stuck}; their work: {items}")


def drive_trains(
    *pools: Pool,
    max_rounds: int = 400,
    until: Callable[[], bool],
    each_round: Callable[[], None] | None = None,
) -> int:
    """Tick the trains, then the pools, then run the simulator, until `until` holds. The
    invariants are verified after every round."""
    from trains.services.tick import trains_tick

    for round_number in range(1, max_rounds + 1):
        trains_tick()
        for pool in pools:
            pool_tick(pool_id=pool.pk)
        simulated_work_step()
        violations = check_invariants()
        assert not violations, f"round {round_number}: {violations}"
        if each_round:
            each_round()
        if until():
            return round_number
    raise AssertionError(f"not done after {max_rounds} rounds")


def in_threads(*targets: Callable[[], None], timeout: float = 120) -> list[BaseException]:
    """Run each target in its own thread with its own database connection; return what they raised."""
    errors: list[BaseException] = []

    def run(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return errors
