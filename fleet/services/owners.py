"""Services, where they run, and what their owners ask of trains: opt-out windows, reservations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import CapacityReservation, Host, OptOutWindow, Pool, Service, ServicePlacement
from fleet.services.common import validated_save
from opsplanner import clock
from opsplanner.events import Actor, actor_user, event_record


@transaction.atomic
def service_create(
    *, name: str, display_name: str = "", description: str = "", owners: Iterable = (), actor: Actor = None
) -> Service:
    service = validated_save(Service(name=name, display_name=display_name or name, description=description))
    service.owners.set(list(owners))
    event_record(kind="service.created", subject=service, actor=actor, data={"name": name})
    return service


@transaction.atomic
def service_place(*, service: Service, hosts: Iterable[Host], running_jobs: int = 1, actor: Actor = None) -> int:
    """Place service on hosts (already placed hosts are left alone). Returns how many were added."""
    if running_jobs < 0:
        raise ValidationError({"running_jobs": "Running jobs cannot be negative."})
    host_ids = sorted({host.pk for host in hosts})
    if not host_ids:
        raise ValidationError({"hosts": "Name at least one host."})
    existing = set(
        ServicePlacement.objects.filter(service=service, host_id__in=host_ids).values_list("host_id", flat=True)
    )
    new = [
        ServicePlacement(service=service, host_id=host_id, running_jobs=running_jobs)
        for host_id in host_ids
        if host_id not in existing
    ]
    ServicePlacement.objects.bulk_create(new)
    event_record(
        kind="service.placed",
        subject=service,
        actor=actor,
        data={"hosts_added": len(new), "running_jobs": running_jobs},
    )
    return len(new)


def _not_in_past(ends_at: dt.datetime) -> None:
    if ends_at <= clock.now():
        raise ValidationError({"ends_at": "This window is already over; its end must be in the future."})


def _fits_pool(pool: Pool, min_hosts_in_service: int) -> None:
    pool_size = Host.objects.filter(pool=pool).count()
    if min_hosts_in_service > pool_size:
        raise ValidationError(
            {
                "min_hosts_in_service": f"Pool {pool.name} has only {pool_size} hosts; "
                f"cannot reserve {min_hosts_in_service}."
            }
        )


def _still_editable(window: OptOutWindow | CapacityReservation) -> None:
    """Only a live window may change: a cancelled or finished one is history (register a new one)."""
    label = f"{str(window._meta.verbose_name).capitalize()} #{window.pk}"
    if window.cancelled_at is not None:
        raise ValidationError(
            f"{label} was cancelled at {window.cancelled_at:%Y-%m-%d %H:%M} UTC and cannot be edited; "
            "register a new one instead."
        )
    if window.ends_at <= clock.now():
        raise ValidationError(
            f"{label} is already over (it ended at {window.ends_at:%Y-%m-%d %H:%M} UTC) and cannot be edited; "
            "register a new one instead."
        )


def _window_times(window: OptOutWindow | CapacityReservation) -> dict[str, str]:
    return {"starts_at": window.starts_at.isoformat(), "ends_at": window.ends_at.isoformat()}


@transaction.atomic
def optout_window_create(
    *, service: Service, starts_at: dt.datetime, ends_at: dt.datetime, reason: str, actor: Actor = None
) -> OptOutWindow:
    window = OptOutWindow(
        service=service, starts_at=starts_at, ends_at=ends_at, reason=reason, created_by=actor_user(actor)
    )
    window.full_clean()
    _not_in_past(ends_at)
    window.save()
    event_record(
        kind="optout_window.created",
        subject=window,
        actor=actor,
        reason=reason,
        data={"service": service.name, "starts_at": starts_at.isoformat(), "ends_at": ends_at.isoformat()},
    )
    return window


@transaction.atomic
def optout_window_update(
    *, window_id: int, starts_at: dt.datetime, ends_at: dt.datetime, reason: str, actor: Actor = None
) -> OptOutWindow:
    """Move or re-word a live window; a cancelled or finished one is refused, saying why."""
    window = OptOutWindow.objects.select_for_update().get(pk=window_id)
    _still_editable(window)
    before = {**_window_times(window), "reason": window.reason}
    window.starts_at, window.ends_at, window.reason = starts_at, ends_at, reason
    window.full_clean()
    _not_in_past(ends_at)
    if before == {**_window_times(window), "reason": window.reason}:
        return window  # nothing changed, so no event
    window.save(update_fields=["starts_at", "ends_at", "reason"])
    event_record(
        kind="optout_window.updated",
        subject=window,
        actor=actor,
        reason=reason,
        data={"service": window.service.name, **_window_times(window), "before": before},
    )
    return window


@transaction.atomic
def optout_window_cancel(*, window_id: int, reason: str, actor: Actor = None) -> bool:
    """Cancel a window; False when it was already cancelled."""
    changed = OptOutWindow.objects.filter(pk=window_id, cancelled_at__isnull=True).update(cancelled_at=clock.now())
    if changed != 1:
        return False
    window = OptOutWindow.objects.get(pk=window_id)
    event_record(kind="optout_window.cancelled", subject=window, actor=actor, reason=reason)
    return True


@transaction.atomic
def reservation_create(
    *,
    service: Service,
    pool: Pool,
    min_hosts_in_service: int,
    starts_at: dt.datetime,
    ends_at: dt.datetime,
    reason: str,
    actor: Actor = None,
) -> CapacityReservation:
    reservation = CapacityReservation(
        service=service,
        pool=pool,
        min_hosts_in_service=min_hosts_in_service,
        starts_at=starts_at,
        ends_at=ends_at,
        reason=reason,
        created_by=actor_user(actor),
    )
    reservation.full_clean()
    _not_in_past(ends_at)
    _fits_pool(pool, min_hosts_in_service)
    reservation.save()
    event_record(
        kind="reservation.created",
        subject=reservation,
        actor=actor,
        reason=reason,
        pool_id=pool.pk,
        data={"service": service.name, "min_hosts_in_service": min_hosts_in_service},
    )
    return reservation


@transaction.atomic
def reservation_update(
    *,
    reservation_id: int,
    min_hosts_in_service: int,
    starts_at: dt.datetime,
    ends_at: dt.datetime,
    reason: str,
    actor: Actor = None,
) -> CapacityReservation:
    """Change a live reservation's size, times or reason (its pool stays: reserve elsewhere anew)."""
    reservation = CapacityReservation.objects.select_for_update().get(pk=reservation_id)
    _still_editable(reservation)
    before = {
        **_window_times(reservation),
        "reason": reservation.reason,
        "min_hosts_in_service": reservation.min_hosts_in_service,
    }
    reservation.min_hosts_in_service = min_hosts_in_service
    reservation.starts_at, reservation.ends_at, reservation.reason = starts_at, ends_at, reason
    reservation.full_clean()
    _not_in_past(ends_at)
    _fits_pool(reservation.pool, min_hosts_in_service)
    after = {**_window_times(reservation), "reason": reason, "min_hosts_in_service": min_hosts_in_service}
    if before == after:
        return reservation  # nothing changed, so no event
    reservation.save(update_fields=["min_hosts_in_service", "starts_at", "ends_at", "reason"])
    event_record(
        kind="reservation.updated",
        subject=reservation,
        actor=actor,
        reason=reason,
        pool_id=reservation.pool_id,
        data={
            "service": reservation.service.name,
            **_window_times(reservation),
            "min_hosts_in_service": min_hosts_in_service,
            "before": before,
        },
    )
    return reservation


@transaction.atomic
def reservation_cancel(*, reservation_id: int, reason: str, actor: Actor = None) -> bool:
    changed = CapacityReservation.objects.filter(pk=reservation_id, cancelled_at__isnull=True).update(
        cancelled_at=clock.now()
    )
    if changed != 1:
        return False
    reservation = CapacityReservation.objects.get(pk=reservation_id)
    event_record(
        kind="reservation.cancelled", subject=reservation, actor=actor, reason=reason, pool_id=reservation.pool_id
    )
    return True
