"""manage.py check_invariants finds violations in a live database and exits non-zero."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from fleet.models import Host, Pool
from opsplanner.management.commands.check_invariants import CHECKED_TABLES
from opsplanner.models import HostTask, OperationSource
from opsplanner.selectors import invariants
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


def run_check(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("check_invariants", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_healthy_fleet_passes_after_real_work() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=2)
    operation_submit(kind="upgrade", component="gpu-driver", version="560.35.03", scope=f"pool {pool.name}", reason="r")
    drive(pool)
    out, err = run_check()
    assert out.strip() == "check_invariants: no violation"
    assert err == ""


def test_a_host_out_of_service_with_no_holder_is_reported_as_stuck() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2)
    Host.objects.filter(pk=hosts[0].pk).update(state="maintenance")
    with pytest.raises(CommandError, match=r"2 invariant violation\(s\)") as caught:
        run_check()
    assert caught.value.returncode == 1


def test_the_report_names_each_violation() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2)
    Host.objects.filter(pk=hosts[0].pk).update(state="maintenance")
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("check_invariants", stdout=io.StringIO(), stderr=err)
    lines = err.getvalue().splitlines()
    assert f"[stuck_host] host {hosts[0].hostname} ({hosts[0].pk}) is maintenance and nobody holds it" in lines
    assert f"[silent_change] host {hosts[0].pk} is maintenance with no event saying so" in lines


def test_more_hosts_out_than_the_planned_buffer_is_a_violation() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    pool_tick(pool_id=pool.pk)
    assert HostTask.objects.filter(state="draining").count() == 2
    Pool.objects.filter(pk=pool.pk).update(planned_buffer_hosts=1)
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("check_invariants", "--pool", pool.name, stdout=io.StringIO(), stderr=err)
    assert f"[planned_buffer] pool {pool.name}: 2 hosts out for planned work, buffer 1" in err.getvalue()


@pytest.mark.django_db(transaction=True)
def test_it_reads_one_moment_so_an_emergency_drain_committed_while_it_runs_is_not_seen_half(monkeypatch) -> None:
    """Seen by CI with real workers: the emergency leases were counted before an admission committed and
    the hosts out after it, which read as the planned buffer and the floor broken."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    operation_submit(
        kind="reboot", scope=f"pool {pool.name}", reason="CVE", source=OperationSource.EMERGENCY, override_buffers=True
    )

    def admitted_elsewhere() -> None:
        pool_tick(pool_id=pool.pk)
        connection.close()

    real_capacities = invariants.pool_capacities

    def capacities_after_an_admission_commits():  # type: ignore[no-untyped-def]
        if not HostTask.objects.filter(state="draining").exists():
            admission = threading.Thread(target=admitted_elsewhere)
            admission.start()
            admission.join()
        return real_capacities()

    monkeypatch.setattr(invariants, "pool_capacities", capacities_after_an_admission_commits)
    assert check_invariants() == []  # the moment before the admission, whole
    assert HostTask.objects.filter(state="draining").count() == 2  # it did commit, past the planned buffer
    assert check_invariants() == []  # and the moment after it, whole


def test_an_unknown_pool_is_refused() -> None:
    with pytest.raises(CommandError, match="There is no pool named 'nope'"):
        run_check("--pool", "nope")


def test_tables_never_analyzed_get_statistics_before_the_check() -> None:
    """Autovacuum is off on some servers (this machine's among them): unanalyzed, the event checks
    are planned as nested loops. The command analyzes such tables first, and says so when asked."""
    make_fleet(domains=1, hosts_per_domain=2)
    with connection.cursor() as cursor:  # as after a restore (rolled back with the test)
        cursor.execute("UPDATE pg_class SET reltuples = -1 WHERE relname = ANY(%s)", [list(CHECKED_TABLES)])
    out, err = run_check("--verbosity", "2")
    assert f"analyzed {', '.join(sorted(CHECKED_TABLES))} first" in out
    assert err == ""
    assert out.strip().endswith("check_invariants: no violation")
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND reltuples < 0", [list(CHECKED_TABLES)])
        assert cursor.fetchall() == []
    assert "analyzed" not in run_check("--verbosity", "2")[0]  # once is enough
