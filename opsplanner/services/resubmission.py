"""Nothing lost when a version is withdrawn after it superseded an operator's ad-hoc upgrade: the
host got N+1 instead of the N asked for, and N's task ended `superseded`; N+1's rollback now takes
the host to what it ran before (`InstalledVersion.previous_version`), below N, and nothing would ever
install N. The withdrawal asks for N again on those hosts: a new ad-hoc operation with the original's
options, linked to it (`Operation.resubmission_of`), with an event saying why. The completed train
upgrades that fell back the same way are made active again instead (trains/services/offboarding.py).

Runs in the withdrawal's transaction, after its rollback is submitted. The rollback (at just below
repair priority) takes the host first and hands it to N in the same drain; an N asked at a higher
priority than the rollback takes the host first and the rollback then ends superseded by it (it only
waited for it: supersede.py), either way the host leaves the withdrawn version for N, and were N to
fail or be cancelled the rollback still runs. Unlike the original, the resubmission takes "N or
newer" (`or_newer`): the original accepted the newer version in N's place (it was superseded), and is
asked again only because that version is withdrawn; were it given back (its upgrade re-onboarded, whose
rollbacks are then cancelled) before the host leaves it, N finishes with nothing to do instead of
taking the host back down. While the host runs the withdrawn version, N is no "nothing to do".

Each superseded task is asked for again once (a second withdrawal, or a release and a withdrawal,
finds the resubmission and leaves it, done, pending or cancelled by an operator); not for an
operation the operator cancelled; and not for an N withdrawn since or now incompatible: an alert
(`alert.resubmission_refused`) says why instead."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef

from fleet.models import ComponentVersion, InstalledVersion
from opsplanner.events import Actor, event_record
from opsplanner.models import HostTask, Operation, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.compatibility import withdrawn_refusal
from opsplanner.services.operations import operation_submit
from opsplanner.services.rollback import going_back_below


class LostWork(NamedTuple):
    """One operation's superseded work that the rollback of a withdrawn version takes hosts below."""

    operation: Operation
    host_ids: list[int]
    pool_ids: set[int]


def _lost_work(withdrawn: ComponentVersion) -> list[LostWork]:
    """The ad-hoc upgrades (not cancelled) to an older version of the withdrawn one's component whose
    task ended superseded once the host had the withdrawn version (superseded by it: the task ended
    when or after the host got it), on hosts still running it that its rollback takes below their
    target, and not resubmitted for that host already. By operation, in id order (two queries)."""
    fell_back = InstalledVersion.objects.filter(
        going_back_below(OuterRef("operation__component_version__sort_key")),
        host_id=OuterRef("host_id"),
        version=withdrawn,
        installed_at__lte=OuterRef("finished_at"),
    )
    asked_again = HostTask.objects.filter(
        host_id=OuterRef("host_id"), operation__resubmission_of=OuterRef("operation_id")
    )
    rows = (
        HostTask.objects.filter(
            Exists(fell_back),
            host_id__in=InstalledVersion.objects.filter(version=withdrawn).values("host_id"),
            state=TaskState.CANCELLED,
            failure_code=FailureCode.SUPERSEDED,
            operation__kind=OperationKind.UPGRADE,
            operation__source=OperationSource.AD_HOC,
            operation__cancelled_at__isnull=True,
            operation__component_version__component_id=withdrawn.component_id,
            operation__component_version__sort_key__lt=withdrawn.sort_key,
        )
        .exclude(Exists(asked_again))
        .values_list("operation_id", "host_id", "pool_id")
    )
    hosts: dict[int, list[int]] = defaultdict(list)
    pools: dict[int, set[int]] = defaultdict(set)
    for operation_id, host_id, pool_id in rows:
        hosts[operation_id].append(host_id)
        pools[operation_id].add(pool_id)
    operations = Operation.objects.filter(pk__in=list(hosts)).select_related("component_version__component")
    return [LostWork(op, sorted(hosts[op.pk]), pools[op.pk]) for op in operations.order_by("pk")]


def superseded_work_resubmit(*, withdrawn: ComponentVersion, why: str, actor: Actor) -> list[int]:
    """Ask again for the ad-hoc work the withdrawn version superseded and its rollback takes below
    (`_lost_work`): one operation per original, for its hosts that fell back. `why` the version was
    withdrawn. In the withdrawal's transaction, after its rollback; the operations submitted."""
    submitted = []
    for lost in _lost_work(withdrawn):
        target = lost.operation.component_version
        assert target is not None  # an upgrade has its target (operation_upgrade_has_target)
        lost_why = (
            f"{withdrawn}, which superseded {target} on {len(lost.host_ids)} hosts of operation "
            f"#{lost.operation.pk}, was {why}: its rollback takes them below {target}"
        )
        again = _resubmit(lost, target, lost_why, actor=actor)
        if again is not None:
            submitted.append(again.pk)
    return submitted


def _resubmit(lost: LostWork, target: ComponentVersion, why: str, *, actor: Actor) -> Operation | None:
    """The original's work again on the hosts that fell back, with its options; or, when its target
    is withdrawn or now refused (incompatible), an alert saying so, and None."""
    original = lost.operation
    refusal = withdrawn_refusal(target)
    if refusal is not None:
        _refusal_record(lost, target, why, refusal.message, actor=actor)
        return None
    try:
        again = operation_submit(
            kind=OperationKind.UPGRADE,
            scope=f"resubmission of operation #{original.pk} on {len(lost.host_ids)} hosts",
            host_ids=lost.host_ids,
            component=target.component.name,
            version=target.version,
            reason=f"asked again: {why} (operation #{original.pk}: {original.reason})"[:500],
            priority=original.priority,
            source=OperationSource.AD_HOC,
            needs_drain=original.needs_drain,
            gang=original.gang,
            estimated_duration_s=original.estimated_duration_s,
            executor=original.executor,
            drainer=original.drainer,
            max_attempts=original.max_attempts,
            drain_timeout_s=original.drain_timeout_s,
            or_newer=True,  # the newer version, were it no longer withdrawn, will do (as it did)
            resubmission_of=original.pk,
            actor=actor,
        )
    except ValidationError as refused:  # incompatible now, say
        _refusal_record(lost, target, why, "; ".join(refused.messages), actor=actor)
        return None
    event_record(
        kind="operation.resubmitted",
        subject=again,
        actor=actor,
        reason=why[:500],
        pool_id=_one_pool(lost),
        data={"original": original.pk, "target": str(target), "hosts": lost.host_ids[:100]},
    )
    return again


def _refusal_record(lost: LostWork, target: ComponentVersion, why: str, refusal: str, *, actor: Actor) -> None:
    """An alert on the original operation: its work fell back and is not asked again, and why."""
    event_record(
        kind="alert.resubmission_refused",
        subject=lost.operation,
        actor=actor,
        reason=f"{why}, and it is not asked again: {refusal}"[:500],
        pool_id=_one_pool(lost),
        data={"target": str(target), "hosts": lost.host_ids[:100], "refusal": refusal},
    )


def _one_pool(lost: LostWork) -> int | None:
    return next(iter(lost.pool_ids)) if len(lost.pool_ids) == 1 else None
