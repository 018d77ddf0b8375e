"""A run's lane databases are dropped whatever happens, also when making them fails half-way."""

from __future__ import annotations

import pytest
from django.db import connection

from opsplanner.models import AdvisorRunState
from opsplanner.roles import Role
from simulation import runner
from simulation.advisor_runs import advisor_run_execute, advisor_run_request
from tests.trains_builders import make_user

GOOD = {"pool_hosts": 400, "sizes": [16, 40, 80], "interruption_cost": 100, "capacity_hour_cost": 1.5}


def scratch_named(pattern: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1", [pattern])
        return [name for (name,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)  # databases are created and dropped outside any transaction
def test_a_run_whose_lane_cannot_be_migrated_fails_and_leaves_no_lane_database(enqueued, monkeypatch) -> None:
    run = advisor_run_request(**GOOD, actor=make_user(Role.OPERATOR))

    def migrate_fails(database_url: str) -> None:
        raise RuntimeError("migrating the scratch database failed:\nout of disk")

    monkeypatch.setattr(runner, "_migrate", migrate_fails)
    try:
        advisor_run_execute(run_id=run.pk)
        run.refresh_from_db()
        assert run.state == AdvisorRunState.FAILED
        assert "out of disk" in run.failure_reason
        assert scratch_named(f"%_advisor{run.pk}_%_sim") == []
    finally:
        runner.scratch_databases_drop_tagged(f"_advisor{run.pk}")


@pytest.mark.django_db(transaction=True)
def test_lanes_made_before_a_failure_are_dropped_with_it(monkeypatch) -> None:
    """`simulate` and `simulate --from-live` too: their `finally` only drops lanes it was given."""

    def migrate_fails(database_url: str) -> None:
        assert scratch_named("%_reviewleak_0_sim"), "the first lane exists by now"
        raise RuntimeError("could not migrate the lane")

    monkeypatch.setattr(runner, "_migrate", migrate_fails)
    try:
        with pytest.raises(RuntimeError, match="could not migrate the lane"):
            runner.scratch_databases(2, tag="_reviewleak")
        assert scratch_named("%_reviewleak_%_sim") == []
    finally:
        runner.scratch_databases_drop_tagged("_reviewleak")
