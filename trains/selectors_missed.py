"""What a train's visits miss: the share of their hosts recent visits left below the target for
their pass (a failed drain or execution, work deferred), which the forecast takes again at the
domains' next visits, and the catch-ups that made up for some of it.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Count, Q

from opsplanner.models import HostTask, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedQuery

MISSED_WINDOW = dt.timedelta(days=7)  # the visits ended this recently say how many hosts a visit misses
MISSED_MIN_TASKS = 50  # fewer finished tasks than this in the window and no host is expected to be missed
# A task that left its host below the target for this pass: it failed before or while installing,
# or was deferred to the next cycle. A failed check or return comes after the install, and the host
# keeps the version through its repair (a 10-day meta run: 9 of 16 failures, none taken again).
MISSED_TASK = Q(
    state=TaskState.FAILED,
    failure_code__in=[FailureCode.DRAIN_FAILED, FailureCode.EXECUTE_FAILED, FailureCode.UNKNOWN_VERSION],
) | Q(state=TaskState.CANCELLED, failure_code=FailureCode.DEFERRED)

# A task re-submitted for a host repaired in its visit's drain (trains/services/catch_up.py): one
# that succeeded makes up for a missed task of the same pass.
_CATCH_UP = Q(operation__visit_link__catch_up=True)


_VISIT = "operation__visit_link__visit__"
# Every per-upgrade forecast reads it, and the train tick's played cycle (services/cycle_played.py): compiled once.
_MISSED = PreparedQuery(
    lambda *, ids, since: (
        HostTask.objects.filter(
            **{f"{_VISIT}train_id__any": ids, f"{_VISIT}ended_at__gte": since},
            state__in=[TaskState.DONE, TaskState.HANDED_OVER, TaskState.FAILED, TaskState.CANCELLED],
        )
        .exclude(state=TaskState.CANCELLED, failure_code__in=[FailureCode.CANCELLED, FailureCode.SUPERSEDED])
        .values_list(f"{_VISIT}train_id")
        .annotate(
            finished=Count("id", filter=~_CATCH_UP),
            missed=Count("id", filter=MISSED_TASK & ~_CATCH_UP),
            caught_up=Count("id", filter=_CATCH_UP & Q(state__in=[TaskState.DONE, TaskState.HANDED_OVER])),
        )
        .order_by()
    ),
    ids=IDS,
    since=dt.datetime,
)


def trains_missed_share(train_ids: list[int], *, now: dt.datetime) -> dict[int, float]:
    """Per train, of the tasks of its visits that ended within MISSED_WINDOW, the share that left
    their host below the target for that pass (MISSED_TASK, less the catch-ups that made up for
    one); such a host is taken again at its domain's next visit. Trains with fewer than
    MISSED_MIN_TASKS such tasks are left out (one query)."""
    rows = _MISSED.rows(ids=train_ids, since=now - MISSED_WINDOW)
    return {
        train_id: max(0, missed - caught_up) / finished
        for train_id, finished, missed, caught_up in rows
        if finished >= MISSED_MIN_TASKS
    }


def hosts_missed(share: float, hosts: int) -> int:
    """How many of `hosts` a pass of visits is expected to miss at the measured share: none while
    fewer than half a host is expected (the forecast reads as if every host succeeds)."""
    expected = share * hosts
    return 0 if expected < 0.5 else min(hosts, max(1, round(expected)))
