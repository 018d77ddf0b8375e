"""The bounds of what operators and integrations may ask of trains and upgrades: one place, read by
the API's serializers (console/api/serializers/trains.py) and the browser forms (trains/forms.py),
so both accept the same values; and the rules on an upgrade's plan that creating it
(trains/services/upgrades.py) and replanning it (trains/services/replan.py) both apply."""

from __future__ import annotations

import datetime as dt

from django.core.exceptions import ValidationError
from django.utils import timezone

from opsplanner.models import MAX_PRIORITY

DAY_S = 24 * 3600
MAX_CYCLE_SLO_S = 366 * DAY_S
MAX_VISIT_ESTIMATE_S = 7 * DAY_S  # also a visit's overhead
MAX_AUTO_RESUME_S = 30 * DAY_S
MAX_DOMAINS_AT_ONCE = 100  # Train.visit_concurrency's bound
MAX_COUNT = 1_000_000  # failures, successes, hosts per visit
MAX_SOAK_S = 30 * DAY_S  # a phase's soak, an upgrade's time per host
FAILURE_RATE_DECIMALS = 4  # Upgrade.max_failure_rate's decimal places
MAX_UPGRADE_PRIORITY = 1000  # Upgrade.priority's bound (its model validator reads it)
MAX_TRAIN_PRIORITY = MAX_PRIORITY  # a train's operations carry its priority


def check_visit_bound(*, multi_cycle: bool, hosts_per_visit: int | None) -> None:
    """A multi-cycle upgrade has a number of hosts per visit, and only a multi-cycle one has it."""
    if multi_cycle and not hosts_per_visit:
        raise ValidationError({"hosts_per_visit": "A multi-cycle upgrade needs a number of hosts per visit."})
    if hosts_per_visit is not None and not multi_cycle:  # a visit bounds only a multi-cycle upgrade's hosts
        raise ValidationError(
            {"hosts_per_visit": "Only a multi-cycle upgrade takes a number of hosts per visit: make it multi-cycle, "
             "or leave the number out."}
        )  # fmt: skip


def check_deadline(deadline: dt.datetime | None, *, now: dt.datetime) -> None:
    """A deadline set now is a moment with its time zone, still to come."""
    if deadline is None:
        return
    if timezone.is_naive(deadline):  # compared with an aware time it raised TypeError
        raise ValidationError({"deadline": "Give the deadline with its time zone."})
    if deadline <= now:
        raise ValidationError({"deadline": "The deadline is in the past."})
