"""A hosts-only source (the bulk API, a CSV import, a Slurm sync) declares the pools it names as
they are live, so that applying it changes no pool. Read before the pools are locked, a pool changed
meanwhile (an operator raising its buffer) would be written back to what it was: silently lost."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from fleet.fleetfile import csv_source, sources
from fleet.fleetfile.sources import hosts_create
from fleet.models import Host, Pool
from fleet.services.catalogue import pool_update
from fleet.sync import sync_hosts
from opsplanner.models import Event
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db(transaction=True)


def _raise_the_buffer_meanwhile(monkeypatch: pytest.MonkeyPatch, module: Any, pool: Pool) -> threading.Thread:
    """When the source has read its pools, an operator raises the pool's planned buffer (its own
    connection, committed unless the pool is locked: then it waits for the source to commit)."""
    real: Callable[..., Any] = module.fleet_spec_from_document
    errors: list[BaseException] = []

    def change() -> None:
        try:
            pool_update(pool_id=pool.pk, changes={"planned_buffer_hosts": 3}, reason="more room")
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=change)

    def spec_from_document(document: dict[str, Any]) -> Any:
        if not thread.is_alive() and thread.ident is None:
            thread.start()
            thread.join(timeout=2)  # done at once, or waiting for the pool's lock
        return real(document)

    monkeypatch.setattr(module, "fleet_spec_from_document", spec_from_document)
    thread.errors = errors  # type: ignore[attr-defined]
    return thread


def _assert_kept(pool: Pool, thread: threading.Thread) -> None:
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert thread.errors == []  # type: ignore[attr-defined]
    assert Pool.objects.get(pk=pool.pk).planned_buffer_hosts == 3
    assert not Event.objects.filter(kind="pool.updated", reason__startswith="created").exists()


def _row(pool: Pool) -> dict[str, Any]:
    return {"hostname": "new-1", "pool": pool.name, "domain": "rack-0001", "sku": "h100", "gpu_count": 8}


def test_a_bulk_host_create_does_not_undo_a_pool_change_made_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    thread = _raise_the_buffer_meanwhile(monkeypatch, sources, pool)

    hosts_create(rows=[_row(pool)], reason="created through the API")

    assert Host.objects.filter(hostname="new-1").exists()
    _assert_kept(pool, thread)


def test_a_csv_import_does_not_undo_a_pool_change_made_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    thread = _raise_the_buffer_meanwhile(monkeypatch, sources, pool)

    csv_source.csv_import(text="hostname,domain,sku\nnew-1,rack-0001,h100\n", pool=pool.name)

    assert Host.objects.filter(hostname="new-1").exists()
    _assert_kept(pool, thread)


def test_a_sync_does_not_undo_a_pool_change_made_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.sync

    pool, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    thread = _raise_the_buffer_meanwhile(monkeypatch, fleet.sync, pool)

    sync_hosts(rows=[_row(pool)], reason="synced from Slurm")

    assert Host.objects.filter(hostname="new-1").exists()
    _assert_kept(pool, thread)
