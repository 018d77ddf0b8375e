"""`field__any=[...]`: one array parameter on PostgreSQL, with the same results as `__in` for ids,
model instances, strings, small-integer columns, sets, None and empty lists."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Host
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def ids(queryset: object) -> list[int]:
    return sorted(queryset.values_list("id", flat=True))  # type: ignore[attr-defined]


def test_ids_match_what_in_finds_and_go_as_one_array_literal() -> None:
    _, hosts = make_fleet(domains=2, hosts_per_domain=3)
    wanted = [hosts[0].pk, hosts[3].pk, hosts[5].pk]
    with CaptureQueriesContext(connection) as queries:
        found = ids(Host.objects.filter(pk__any=wanted))
    assert found == ids(Host.objects.filter(pk__in=wanted)) == sorted(wanted)
    assert "= ANY(" in queries[0]["sql"]
    assert "{" + ",".join(map(str, wanted)) + "}" in queries[0]["sql"]


def test_a_foreign_key_takes_ids_or_model_instances() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    other_pool, other_hosts = make_fleet(domains=1, hosts_per_domain=2)
    by_id = ids(Host.objects.filter(pool__any=[pool.pk]))
    by_instance = ids(Host.objects.filter(pool__any=[pool]))
    assert by_id == by_instance == sorted(h.pk for h in hosts)
    assert ids(Host.objects.filter(pool_id__any={pool.pk, other_pool.pk})) == sorted(h.pk for h in hosts + other_hosts)


def test_strings_none_and_empty_lists() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=3)
    names = [hosts[0].hostname, hosts[2].hostname, None]
    assert ids(Host.objects.filter(hostname__any=names)) == sorted([hosts[0].pk, hosts[2].pk])
    assert list(Host.objects.filter(pk__any=[])) == []
    assert list(Host.objects.filter(pk__any=[None])) == []


def test_a_small_integer_column_is_compared_as_its_own_type() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2)
    Host.objects.filter(pk=hosts[0].pk).update(gpu_count=4)
    assert ids(Host.objects.filter(gpu_count__any=[4, 16])) == [hosts[0].pk]
    assert ids(Host.objects.filter(gpu_count__any=["4"])) == [hosts[0].pk]  # prepared by the field as before
