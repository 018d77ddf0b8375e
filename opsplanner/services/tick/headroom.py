"""The room admission has: how many more hosts may go out for planned work now, and why not more.

headroom = min(planned buffer - planned out, in service - floor, in service - active reservation),
and, for an approved emergency, in service - hard floor. Admission (admission.py) takes from it
task by task; the repair flow (repair.py) asks whether a repaired host may stay out.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from fleet.models import CapacityReservation
from fleet.selectors.capacity import pool_capacity
from opsplanner.models import WaitingCode
from opsplanner.prepared import PreparedQuery
from opsplanner.services.tick.context import TickContext


@dataclass
class Headroom:
    """How many more hosts may go out for planned work now, and the limit that binds."""

    planned: int
    floor: int
    reservation: int
    hard_floor: int
    reservation_reason: str
    planned_reason: str
    floor_reason: str
    hard_floor_reason: str
    out: int = 0  # hosts out for planned work, this tick's included: the room grows by as many as return
    kept_reason: str = ""  # why the room left is kept for a gang ahead in the queue (keep_for_gang)

    def remaining(self, *, emergency: bool = False) -> int:
        """An approved emergency may use everything down to the hard floor; other work stays inside
        the planned buffer, the floor and the reservations."""
        if emergency:
            return self.hard_floor
        return min(self.planned, self.floor, self.reservation, self.hard_floor)

    def take(self) -> None:
        self.planned -= 1
        self.floor -= 1
        self.reservation -= 1
        self.hard_floor -= 1
        self.out += 1

    def keep_for_gang(self, reason: str, *, emergency: bool) -> None:
        """A gang first in line that only lacks room keeps the room left: the work behind it may not
        take it, or with work always arriving the room would never grow to the gang's size."""
        room = max(self.remaining(emergency=emergency), 0)
        self.planned -= room
        self.floor -= room
        self.reservation -= room
        self.hard_floor -= room
        if room:
            self.kept_reason = reason

    def keep_out_refusal(self) -> str | None:
        """Why a host already out of service (a repaired one) may not stay out for planned work, or
        None: it takes a place in the planned buffer, and the pool must not be below its floors or a
        reservation now (then the host returns: the pool needs it more)."""
        if self.planned <= 0:
            return self.planned_reason
        for room, reason in (
            (self.hard_floor, self.hard_floor_reason),
            (self.floor, self.floor_reason),
            (self.reservation, self.reservation_reason),
        ):
            if room < 0:
                return reason
        return None

    def keep_out(self) -> None:
        """A host out of service stays out for planned work: only the planned buffer changes."""
        self.planned -= 1

    def refusal(self, *, emergency: bool = False) -> tuple[str, str]:
        if emergency:
            return WaitingCode.FLOOR, self.hard_floor_reason
        if self.kept_reason:  # set only when the gang kept some room: what binds now is the keeping
            return WaitingCode.QUEUED, self.kept_reason
        if self.hard_floor <= 0:
            return WaitingCode.FLOOR, self.hard_floor_reason
        if self.planned <= 0:
            return WaitingCode.PLANNED_BUFFER, self.planned_reason
        if self.floor <= 0:
            return WaitingCode.FLOOR, self.floor_reason
        return WaitingCode.RESERVATION, self.reservation_reason


# The binding reservation, compiled once (see opsplanner.prepared).
_BINDING_RESERVATION = PreparedQuery(  # the one that keeps the most hosts in service
    lambda *, pool_id, now: (
        CapacityReservation.objects.filter(
            pool_id=pool_id, cancelled_at__isnull=True, starts_at__lte=now, ends_at__gt=now
        )
        .order_by("-min_hosts_in_service", "id")
        .values_list("id", "service__name", "min_hosts_in_service", "ends_at")[:1]
    ),
    pool_id=int,
    now=dt.datetime,
)


def pool_headroom(ctx: TickContext) -> Headroom:
    capacity = pool_capacity(ctx.pool)
    buffers = capacity.buffers
    name = ctx.pool.name
    reservation_room, reservation_reason = capacity.total, ""
    for reservation_id, service, keeps, ends in _BINDING_RESERVATION.rows(pool_id=ctx.pool.pk, now=ctx.now):
        reservation_room = capacity.in_service - keeps
        reservation_reason = (
            f"reservation #{reservation_id} of service {service} keeps {keeps} "
            f"hosts of pool {name} in service until {ends:%Y-%m-%d %H:%M} UTC"
        )
    hard_floor = buffers.floor if ctx.pool.hard_floor_hosts is None else ctx.pool.hard_floor_hosts
    return Headroom(
        planned=buffers.planned - capacity.planned_out,
        floor=capacity.in_service - buffers.floor,
        reservation=reservation_room,
        hard_floor=capacity.in_service - hard_floor,
        reservation_reason=reservation_reason,
        planned_reason=f"planned buffer of pool {name} is full ({buffers.planned} hosts)",
        floor_reason=f"pool {name} is at its floor of {buffers.floor} hosts in service",
        hard_floor_reason=f"pool {name} is at its hard floor of {hard_floor} hosts in service",
        out=capacity.planned_out,
    )
