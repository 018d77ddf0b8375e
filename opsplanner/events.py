"""Writing events. Services call event_record inside their transaction, so the event commits or
rolls back with the change it describes."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from opsplanner import clock
from opsplanner.bulk import copy_rows
from opsplanner.live import announce_after_commit, groups_for
from opsplanner.models import Event

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, what get_user_model() returns

Actor = AbstractBaseUser | AnonymousUser | str | None
SYSTEM_ACTOR = "system"


def actor_fields(actor: Actor) -> tuple[int | None, str]:
    """(actor_id, actor label) for a user, a named system part ("seed_demo"), or None (system)."""
    if actor is None:
        return None, SYSTEM_ACTOR
    if isinstance(actor, str):
        return None, actor or SYSTEM_ACTOR
    if not actor.is_authenticated:
        return None, "anonymous"
    return actor.pk, actor.get_username()


def event_record(
    *,
    kind: str,
    subject: Any,
    actor: Actor = None,
    reason: str = "",
    pool_id: int | None = None,
    host_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    actor_id, actor_label = actor_fields(actor)
    subject_type = subject._meta.label_lower
    announce_after_commit(groups_for([pool_id], [subject_type]))
    return Event.objects.create(
        created_at=clock.now(),
        kind=kind,
        actor_id=actor_id,
        actor=actor_label,
        subject_type=subject_type,
        subject_id=subject.pk,
        pool_id=pool_id,
        host_id=host_id,
        reason=reason,
        data=data or {},
    )


def actor_user(actor: Actor) -> User | None:
    """The user behind an actor, for created_by fields; None for the system or anonymous."""
    if actor is None or isinstance(actor, str) or not actor.is_authenticated:
        return None
    # An authenticated actor is a request's user, an instance of settings.AUTH_USER_MODEL.
    return cast("User", actor)


class EventRow(NamedTuple):
    """One event as set-based code writes it (events_copy_rows): the Event table's columns in order,
    data as JSON text. Hot loops (the tick writes thousands) build it positionally, since keywords
    cost several times more per row; the field names still say what each position is."""

    created_at: Any  # a datetime, or its ISO text (the tick formats `now` once)
    kind: str
    actor_id: int | None
    actor: str
    subject_type: str
    subject_id: int | None
    pool_id: int | None
    host_id: int | None
    reason: str
    data: str  # JSON text


EVENT_COLUMNS = EventRow._fields


def event_row(
    *,
    kind: str,
    subject_type: str,
    subject_id: int | None,
    now: Any,
    actor: str = "scheduler",
    actor_id: int | None = None,
    reason: str = "",
    pool_id: int | None = None,
    host_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> EventRow:
    """An event row by name, for set-based code that writes many at once with events_copy_rows."""
    return EventRow(
        created_at=now,
        kind=kind,
        actor_id=actor_id,
        actor=actor,
        subject_type=subject_type,
        subject_id=subject_id,
        pool_id=pool_id,
        host_id=host_id,
        reason=reason,
        data=json.dumps(data or {}),
    )


def events_copy_rows(rows: Sequence[EventRow]) -> None:
    """The one way to write events in bulk: COPY on PostgreSQL (bulk_create elsewhere), no model
    instance per event, and the live pages told after commit."""
    copy_rows(Event, EVENT_COLUMNS, rows)
    announce_after_commit(groups_for({row.pool_id for row in rows}, {row.subject_type for row in rows}))


# A tick that fails for good (a stored scope naming a pool renamed since) fails again at every beat,
# every 2 s: one event per reason and subject is enough until this much time has passed.
ROLLED_BACK_REPEAT_AFTER = dt.timedelta(minutes=10)


def rolled_back_tick_record(*, kind: str, subject_type: str, subject_id: int, pool_id: int, reason: str) -> bool:
    """Nothing silent: a tick that was rolled back leaves an event saying why, written after (outside)
    the rolled-back transaction. The same reason for the same subject again within
    ROLLED_BACK_REPEAT_AFTER is not written twice. True when the event was written."""
    now = clock.now()
    last = (
        Event.objects.filter(subject_type=subject_type, subject_id=subject_id, kind=kind)
        .order_by("-id")
        .values_list("reason", "created_at")
        .first()
    )
    if last is not None and last[0] == reason and now - last[1] < ROLLED_BACK_REPEAT_AFTER:
        return False
    events_copy_rows(
        [
            event_row(
                kind=kind, subject_type=subject_type, subject_id=subject_id, now=now, reason=reason, pool_id=pool_id
            )
        ]
    )
    return True
