"""Events are the audit trail: the database itself refuses to change or delete one, whoever asks
(the ORM, raw SQL), and the refusal says why."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from opsplanner import clock
from opsplanner.models import Event

pytestmark = pytest.mark.django_db


def an_event() -> Event:
    return Event.objects.create(
        created_at=clock.now(), kind="host.state_changed", actor="test", subject_type="fleet.host", subject_id=1
    )


def test_the_database_refuses_to_change_an_event_and_it_stays_as_written() -> None:
    event = an_event()
    with pytest.raises(IntegrityError, match="immutable audit trail"), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(reason="rewritten")
    with pytest.raises(IntegrityError, match="event_append_only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE opsplanner_event SET actor = 'someone else' WHERE id = %s", [event.pk])
    stored = Event.objects.get(pk=event.pk)
    assert (stored.reason, stored.actor) == ("", "test")


def test_the_database_refuses_to_delete_an_event() -> None:
    event = an_event()
    with pytest.raises(IntegrityError, match="cannot be changed or deleted"), transaction.atomic():
        Event.objects.filter(pk=event.pk).delete()
    with pytest.raises(IntegrityError, match="event_append_only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM opsplanner_event")
    assert Event.objects.filter(pk=event.pk).exists()


def test_new_events_are_still_written_one_at_a_time_and_in_bulk() -> None:
    from opsplanner.events import event_row, events_copy_rows

    before = Event.objects.count()
    an_event()
    events_copy_rows(
        [
            event_row(kind="task.state_changed", subject_type="opsplanner.hosttask", subject_id=n, now=clock.now())
            for n in range(3)
        ]
    )
    assert Event.objects.count() == before + 4
