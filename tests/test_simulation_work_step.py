"""The simulation's worker step asks only for what can be there: a claim only when work is ready, a
finish only when some is due (simulation/engine.py, `_work_step`), each half a transaction of its own."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from opsplanner import clock
from opsplanner.models import WorkItem, WorkState
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from simulation.engine import _work_step
from tests.builders import make_fleet
from tests.driving import instant_simulator

pytestmark = pytest.mark.django_db


def a_ready_drain() -> WorkItem:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="kernel")
    pool_tick(pool_id=pool.pk, kick=False)
    return WorkItem.objects.get(state=WorkState.READY)


def test_a_step_with_nothing_ready_and_nothing_due_asks_the_database_nothing() -> None:
    profile = instant_simulator()

    with CaptureQueriesContext(connection) as queries:
        assert _work_step(profile, claim=False, finish=False) == 0

    assert len(queries) == 0


def test_work_claimed_with_no_duration_is_finished_in_the_same_step() -> None:
    profile = instant_simulator()
    drain = a_ready_drain()

    assert _work_step(profile, claim=True, finish=False) == 1

    drain.refresh_from_db()
    assert drain.state == WorkState.DONE


def test_work_claimed_with_a_duration_runs_until_it_is_due_and_no_finish_is_tried_before() -> None:
    profile = instant_simulator(drain_seconds=600.0)
    drain = a_ready_drain()

    with CaptureQueriesContext(connection) as queries:
        assert _work_step(profile, claim=True, finish=False) == 0

    drain.refresh_from_db()
    assert drain.state == WorkState.RUNNING
    assert drain.claimed_at is not None
    assert drain.due_at == drain.claimed_at + dt.timedelta(seconds=600)
    assert not [q for q in queries if '"due_at" <=' in q["sql"]], "nothing could be due: no finish was asked"

    due_at = drain.due_at
    with clock.use_clock(lambda: due_at):
        assert _work_step(profile, claim=False, finish=True) == 1

    drain.refresh_from_db()
    assert drain.state == WorkState.DONE
