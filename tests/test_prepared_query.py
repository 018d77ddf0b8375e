"""PreparedQuery: a queryset compiled once, then run with new parameters, giving what the ORM gives."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, QuerySet
from django.test.utils import CaptureQueriesContext

from fleet.models import Host, HostState
from opsplanner import clock
from opsplanner.models import Operation, WorkItem
from opsplanner.prepared import IDS, PreparedModels, PreparedQuery, PreparedUpdate
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


class CountingBuild:
    """A build function that counts how often the queryset is built."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *, pool_id: int, since: dt.datetime, ids: frozenset[int]) -> QuerySet[Host]:
        self.calls += 1
        return (
            Host.objects.filter(pool_id=pool_id, state_changed_at__gte=since, pk__any=ids)
            .order_by("id")
            .values_list("id", "hostname", "state", "state_changed_at")
        )


def test_it_gives_what_the_orm_gives_for_new_values_and_builds_the_queryset_once() -> None:
    first_pool, first_hosts = make_fleet(domains=1, hosts_per_domain=3)
    second_pool, second_hosts = make_fleet(domains=1, hosts_per_domain=2)
    build = CountingBuild()
    query = PreparedQuery(build, pool_id=int, since=dt.datetime, ids=IDS)
    long_ago = clock.now() - dt.timedelta(days=1)
    for pool, ids in [
        (first_pool, {h.pk for h in first_hosts}),
        (first_pool, {first_hosts[1].pk}),
        (second_pool, {h.pk for h in second_hosts + first_hosts}),
    ]:
        expected = list(build(pool_id=pool.pk, since=long_ago, ids=frozenset(ids)))
        assert query.rows(pool_id=pool.pk, since=long_ago, ids=ids) == expected
        assert expected  # the comparison means something
    assert query.rows(pool_id=first_pool.pk, since=clock.now() + dt.timedelta(days=1), ids={first_hosts[0].pk}) == []
    assert build.calls == 3 + 1, "built once by the prepared query, the other three times by this test"


def test_an_empty_collection_of_ids_matches_nothing_without_asking_the_database() -> None:
    make_fleet(domains=1, hosts_per_domain=2)
    query = PreparedQuery(lambda *, ids: Host.objects.filter(pk__any=ids).values_list("id"), ids=IDS)
    with CaptureQueriesContext(connection) as queries:
        assert query.rows(ids=set()) == []
    assert len(queries) == 0


def test_json_columns_come_back_as_the_orm_returns_them() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="prepared query")
    pool_tick(pool_id=pool.pk)
    query = PreparedQuery(
        lambda *, pool_id: WorkItem.objects.filter(pool_id=pool_id).order_by("id").values_list("id", "params"),
        pool_id=int,
    )
    rows = query.rows(pool_id=pool.pk)
    assert rows == list(WorkItem.objects.filter(pool_id=pool.pk).order_by("id").values_list("id", "params"))
    assert rows
    assert all(isinstance(params, dict) for _, params in rows)


def test_a_parameter_that_does_not_reach_the_sql_as_one_value_is_refused_with_the_reason() -> None:
    query = PreparedQuery(lambda *, ids: Host.objects.filter(pk__in=ids).values_list("id"), ids=IDS)
    with pytest.raises(ValueError, match=r"parameters \['ids'\] do not reach the SQL as values"):
        query.rows(ids={1, 2})


def test_it_refuses_parameters_it_was_not_prepared_with() -> None:
    query = PreparedQuery(lambda *, state: Host.objects.filter(state=state).values_list("id"), state=str)
    assert query.rows(state=HostState.IN_SERVICE) == []
    with pytest.raises(TypeError, match=r"expected parameters \['state'\], got \['pool'\]"):
        query.rows(pool=1)


def test_a_prepared_update_changes_what_the_orm_update_would_and_says_how_many_rows() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4)
    move = PreparedUpdate(
        lambda *, ids, expected, new, now: Host.objects.filter(pk__any=ids, state=expected),
        lambda *, ids, expected, new, now: {"state": new, "state_changed_at": now},
        ids=IDS,
        expected=str,
        new=str,
        now=dt.datetime,
    )
    at = clock.now()
    first_two = {hosts[0].pk, hosts[1].pk}
    assert move.count(ids=first_two, expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, now=at) == 2
    # Guarded: a second move from the old state changes nothing.
    assert move.count(ids=first_two, expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, now=at) == 0
    assert move.count(ids=set(), expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, now=at) == 0
    states = dict(Host.objects.filter(pool=pool).values_list("id", "state"))
    assert {host_id for host_id, state in states.items() if state == HostState.MAINTENANCE} == first_two
    assert Host.objects.get(pk=hosts[0].pk).state_changed_at == at
    with pytest.raises(TypeError, match="call count"):
        move.rows(ids=first_two, expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, now=at)


def _hosts_with_their_domain_and_pool(*, pool_id: int, ids: frozenset[int]) -> QuerySet[Host]:
    return (
        Host.objects.filter(pool_id=pool_id, pk__any=ids)
        .select_related("domain", "pool")
        .annotate(versions=Count("installed_versions"))
        .order_by("-id")
    )


def test_prepared_models_give_the_instances_the_orm_gives_with_their_related_objects_and_annotations() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    query = PreparedModels(_hosts_with_their_domain_and_pool, pool_id=int, ids=IDS)
    for ids in [{h.pk for h in hosts}, {hosts[0].pk, hosts[3].pk}]:
        expected = list(_hosts_with_their_domain_and_pool(pool_id=pool.pk, ids=frozenset(ids)))
        got = query.objects(pool_id=pool.pk, ids=ids)
        assert [h.pk for h in got] == [h.pk for h in expected]
        assert len(got) == len(ids)
        for mine, theirs in zip(got, expected, strict=True):
            assert (mine.hostname, mine.state, mine.state_changed_at) == (
                theirs.hostname,
                theirs.state,
                theirs.state_changed_at,
            )
            assert mine.versions == theirs.versions > 0
            with CaptureQueriesContext(connection) as queries:
                assert (mine.domain.name, mine.pool.name) == (theirs.domain.name, pool.name)
            assert len(queries) == 0, "the related objects came with the row"
            assert not mine._state.adding
            assert mine._state.db == "default"
    got[0].state = HostState.MAINTENANCE
    got[0].save(update_fields=["state"])  # an instance the ORM can save, like one it loaded
    assert Host.objects.get(pk=got[0].pk).state == HostState.MAINTENANCE


def _hosts_by_domain(*, pool_id: int) -> QuerySet[Host]:
    return Host.objects.filter(pool_id=pool_id).select_related("domain", "pool").order_by("domain_id", "id")


def test_prepared_models_sharing_related_build_one_instance_per_related_row_with_what_the_orm_gives() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3)
    expected = list(_hosts_by_domain(pool_id=pool.pk))
    got = PreparedModels(_hosts_by_domain, pool_id=int, share_related=True).objects(pool_id=pool.pk)
    assert [(h.pk, h.domain.pk, h.domain.name, h.pool.name) for h in got] == [
        (h.pk, h.domain.pk, h.domain.name, h.pool.name) for h in expected
    ]
    domains = {h.domain_id: {id(other.domain) for other in got if other.domain_id == h.domain_id} for h in got}
    assert all(len(instances) == 1 for instances in domains.values()), "one instance per domain"
    assert len({id(h.domain) for h in got}) == 2, "rows of another domain get their own"
    assert len({id(h.pool) for h in got}) == 1
    unshared = PreparedModels(_hosts_by_domain, pool_id=int).objects(pool_id=pool.pk)
    assert len({id(h.domain) for h in unshared}) == len(hosts), "without sharing, one per row as the ORM builds"


def test_prepared_models_refuse_values_and_are_not_read_as_rows() -> None:
    values = PreparedModels(lambda *, pool_id: Host.objects.filter(pool_id=pool_id).values_list("id"), pool_id=int)
    with pytest.raises(TypeError, match="build it without values"):
        values.objects(pool_id=1)
    models = PreparedModels(lambda *, pool_id: Host.objects.filter(pool_id=pool_id), pool_id=int)
    with pytest.raises(TypeError, match="call objects"):
        models.rows(pool_id=1)


def _prepared_statements_like(pattern: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", [pattern])
        return [statement for (statement,) in cursor.fetchall()]


def _in_service_of_pool(*, pool_id: int) -> QuerySet[Host, tuple[int]]:
    return Host.objects.filter(pool_id=pool_id, state=HostState.IN_SERVICE).order_by("id").values_list("id")


def test_it_runs_as_a_server_side_prepared_statement_after_two_runs_with_its_constants_written_in() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3)
    query = PreparedQuery(_in_service_of_pool, pool_id=int)
    shape = '%FROM "fleet_host"%in_service%'
    for _ in range(2):  # DATABASE_PREPARE_THRESHOLD
        assert query.rows(pool_id=pool.pk) == [(h.pk,) for h in hosts]
    assert _prepared_statements_like(shape) == []
    assert query.rows(pool_id=pool.pk) == [(h.pk,) for h in hosts]
    (statement,) = _prepared_statements_like(shape)
    assert "= 'in_service'" in statement, "the constant is written in, so the kept plan knows it"
    assert '"pool_id" = $1' in statement, "the parameter is bound apart"


def test_it_prepares_nothing_with_a_threshold_of_zero(settings: Any) -> None:
    settings.DATABASE_PREPARE_THRESHOLD = 0
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    query = PreparedQuery(_in_service_of_pool, pool_id=int)
    for _ in range(4):
        assert query.rows(pool_id=pool.pk) == [(h.pk,) for h in hosts]
    assert _prepared_statements_like('%FROM "fleet_host"%in_service%') == []


def test_constants_with_quotes_and_percent_signs_match_what_the_orm_matches() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3)
    Host.objects.filter(pk=hosts[0].pk).update(hostname="50%'s-a")
    Host.objects.filter(pk=hosts[1].pk).update(hostname="50x's-b")  # matched if the % were a wildcard

    def build(*, pool_id: int) -> QuerySet[Host, tuple[str]]:
        return Host.objects.filter(pool_id=pool_id, hostname__startswith="50%'s").values_list("hostname")

    query = PreparedQuery(build, pool_id=int)
    for _ in range(3):  # unprepared, then prepared
        assert query.rows(pool_id=pool.pk) == list(build(pool_id=pool.pk)) == [("50%'s-a",)]


@pytest.mark.parametrize("lookup", ["priority", "priority__lt", "priority__lte", "priority__gt", "priority__gte"])
def test_a_comparison_to_a_small_integer_column_gives_what_the_orm_gives(lookup: str) -> None:
    # The first markers are far out of a small integer column's range, and Django drops such a
    # comparison when it compiles: `=` and `<` then matched nothing, whatever the value.
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    for priority in (100, 200, 300):
        operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="small ints", priority=priority)

    def build(*, priority: int) -> QuerySet[Operation]:
        return Operation.objects.filter(**{lookup: priority}).order_by("id").values_list("id", "priority")

    query = PreparedQuery(build, priority=int)
    for priority in (100, 200, 300, 0):
        assert query.rows(priority=priority) == list(build(priority=priority))
    assert query.rows(priority=200), "every comparison matches something at 200"


def test_a_query_that_can_match_nothing_whatever_its_values_asks_nothing() -> None:
    make_fleet(domains=1, hosts_per_domain=2)
    query = PreparedQuery(
        lambda *, pool_id: Host.objects.filter(pool_id=pool_id, pk__in=[]).values_list("id"), pool_id=int
    )
    with CaptureQueriesContext(connection) as queries:
        assert query.rows(pool_id=1) == []
    assert len(queries) == 0


def test_a_constant_equal_to_a_small_marker_is_refused_rather_than_taken_for_the_parameter() -> None:
    # 31013 is the first marker inside a small integer column's range: the prepared statement
    # would otherwise put the parameter in the constant's place.
    query = PreparedQuery(
        lambda *, priority: Operation.objects.filter(priority__gt=priority, max_attempts__lt=31_013).values_list("id"),
        priority=int,
    )
    with pytest.raises(ValueError, match="a constant of the query equals a marker"):
        query.rows(priority=1)
