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
operation the operator cancelled; and not for an N withdrawn since (by the same fleet file apply too:
writers.py writes its withdrawals first). Each host is judged first: one retired since, or that N
would now put in breach of a compatibility rule, is refused alone, the others still get N. An alert
(`alert.resubmission_refused`) names the hosts refused and says why."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef

from fleet.models import ComponentVersion, Host, InstalledVersion
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner.events import Actor, event_record
from opsplanner.models import HostTask, Operation, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.compatibility import target_refusal
from opsplanner.services.operations import operation_submit
from opsplanner.services.rollback import AS_THEY_ARE, PlannedWithdrawals, going_back_below


class LostWork(NamedTuple):
    """One operation's superseded work that the rollback of a withdrawn version takes hosts below."""

    operation: Operation
    host_ids: list[int]


class Refused(NamedTuple):
    """Fallen hosts not asked for again, and why (one line each: the refusal the submit path gives)."""

    host_ids: list[int]
    refusal: str


def _lost_work(withdrawn: ComponentVersion, planned: PlannedWithdrawals) -> list[LostWork]:
    """The ad-hoc upgrades (not cancelled) to an older version of the withdrawn one's component whose
    task ended superseded once the host had the withdrawn version (superseded by it: the task ended
    when or after the host got it), on hosts still running it that its rollback takes below their
    target, and not resubmitted for that host already. By operation, in id order (two queries)."""
    fell_back = InstalledVersion.objects.filter(
        going_back_below(OuterRef("operation__component_version__sort_key"), planned=planned),
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
        .values_list("operation_id", "host_id")
    )
    hosts: dict[int, list[int]] = defaultdict(list)
    for operation_id, host_id in rows:
        hosts[operation_id].append(host_id)
    operations = Operation.objects.filter(pk__in=list(hosts)).select_related("component_version__component")
    return [LostWork(op, sorted(hosts[op.pk])) for op in operations.order_by("pk")]


class Resubmission(NamedTuple):
    """One operation's superseded work that fell back, as `superseded_work_resubmit` asks for it again."""

    lost: LostWork
    target: ComponentVersion
    requests: list[list[int]]  # the hosts of each operation to submit
    refused: list[Refused]  # the hosts that may not take the target, and why
    pools: dict[int, int]  # host -> pool, the live hosts among them


def resubmissions_foreseen(
    withdrawn: ComponentVersion, *, planned: PlannedWithdrawals = AS_THEY_ARE
) -> list[Resubmission]:
    """The ad-hoc work the withdrawn version superseded and its rollback takes below (`_lost_work`),
    by original in id order: its hosts that fell back, each judged first (one that may no longer
    take the target, retired or now incompatible, does not cost the others theirs; all of them when
    the target is withdrawn), in the operations to submit (a gang stays inside one pool: one per pool
    its hosts are in now). Reads only: `superseded_work_resubmit` submits them, a fleet file's plan
    counts them (`planned`: the versions as the file will have them)."""
    foreseen = []
    for lost in _lost_work(withdrawn, planned):
        target = lost.operation.component_version
        assert target is not None  # an upgrade has its target (operation_upgrade_has_target)
        pools = dict(Host.objects.filter(pk__in=lost.host_ids).values_list("id", "pool_id"))  # live ones
        target_withdrawn = planned.refusal(target)
        refused = (
            [Refused(lost.host_ids, target_withdrawn.message)]
            if target_withdrawn
            else _hosts_refused(lost.host_ids, pools, target)
        )
        barred = {host_id for group in refused for host_id in group.host_ids}
        requests = _requests(lost.operation, {h: pool for h, pool in pools.items() if h not in barred})
        foreseen.append(Resubmission(lost, target, requests, refused, pools))
    return foreseen


def superseded_work_resubmit(*, withdrawn: ComponentVersion, why: str, actor: Actor) -> list[int]:
    """Ask again for the ad-hoc work the withdrawn version superseded and its rollback takes below
    (`resubmissions_foreseen`): one operation per original (per pool for a gang), with its options,
    and an alert naming the hosts refused, with why. `why` the version was withdrawn. In the
    withdrawal's transaction, after its rollback; the operations submitted."""
    submitted = []
    for resubmission in resubmissions_foreseen(withdrawn):
        lost, target = resubmission.lost, resubmission.target
        lost_why = (
            f"{withdrawn}, which superseded {target} on {len(lost.host_ids)} hosts of operation "
            f"#{lost.operation.pk}, was {why}: its rollback takes them below {target}"
        )
        submitted += [again.pk for again in _resubmit(resubmission, lost_why, actor=actor)]
    return submitted


def _resubmit(resubmission: Resubmission, why: str, *, actor: Actor) -> list[Operation]:
    """Submit its operations; one the submit path refuses (a gang now larger than its pool's planned
    buffer, say) joins the hosts refused, named in one alert with why. The operations submitted."""
    lost, target, pools = resubmission.lost, resubmission.target, resubmission.pools
    refused = list(resubmission.refused)
    submitted = []
    for host_ids in resubmission.requests:
        try:
            submitted.append(_submit(lost.operation, host_ids, target, why, pools, actor=actor))
        except ValidationError as refusal:
            refused.append(Refused(host_ids, "; ".join(refusal.messages)))
    if refused:
        _refusal_record(lost, target, why, refused, pools, actor=actor)
    return submitted


def _hosts_refused(host_ids: list[int], pools: dict[int, int], target: ComponentVersion) -> list[Refused]:
    """The hosts that may not take `target` now: retired (or gone) since, not among the live
    `pools`; and those it would put in breach of a compatibility rule (the submit path's refusal)."""
    refused = []
    if gone := [host_id for host_id in host_ids if host_id not in pools]:
        refused.append(Refused(gone, "retired, or no longer in the inventory"))
    incompatible = sorted(host_incompatibilities(sorted(pools), planned=[target]))
    refusal = target_refusal(incompatible, target) if incompatible else None
    if refusal is not None:
        refused.append(Refused(incompatible, refusal.message))
    return refused


def _requests(original: Operation, pools: dict[int, int]) -> list[list[int]]:
    """The hosts of each resubmission: all in one, or a gang's by pool (a gang stays in one pool)."""
    if not original.gang:
        return [sorted(pools)] if pools else []
    by_pool: dict[int, list[int]] = defaultdict(list)
    for host_id, pool_id in sorted(pools.items()):
        by_pool[pool_id].append(host_id)
    return [by_pool[pool_id] for pool_id in sorted(by_pool)]


def _submit(
    original: Operation, host_ids: list[int], target: ComponentVersion, why: str, pools: dict[int, int], *, actor: Actor
) -> Operation:
    """The original's work again on these hosts, with its options, and an event saying why."""
    again = operation_submit(
        kind=OperationKind.UPGRADE,
        scope=f"resubmission of operation #{original.pk} on {len(host_ids)} hosts",
        host_ids=host_ids,
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
    event_record(
        kind="operation.resubmitted",
        subject=again,
        actor=actor,
        reason=why[:500],
        pool_id=_one_pool(host_ids, pools),
        data={"original": original.pk, "target": str(target), "hosts": host_ids[:100]},
    )
    return again


def _refusal_record(
    lost: LostWork, target: ComponentVersion, why: str, refused: list[Refused], pools: dict[int, int], *, actor: Actor
) -> None:
    """An alert on the original operation: the work of these hosts fell back and is not asked again,
    naming them and why."""
    each = sorted((host_id, group.refusal) for group in refused for host_id in group.host_ids)
    names = dict(Host.all_objects.filter(pk__in=[host_id for host_id, _ in each[:100]]).values_list("id", "hostname"))
    named = [names.get(host_id, f"host #{host_id}") for host_id, _ in each[:100]]
    refusal = "; ".join(group.refusal for group in refused)
    listed = ", ".join(named[:5]) + (", …" if len(each) > 5 else "")
    event_record(
        kind="alert.resubmission_refused",
        subject=lost.operation,
        actor=actor,
        reason=f"{why}, and it is not asked again on {len(each)} of them ({listed}): {refusal}"[:500],
        pool_id=_one_pool([host_id for host_id, _ in each], pools),
        data={
            "target": str(target),
            "hosts": [host_id for host_id, _ in each[:100]],
            "refusal": refusal,
            "refused": {name: why_not for name, (_, why_not) in zip(named, each, strict=False)},
        },
    )


def _one_pool(host_ids: list[int], pools: dict[int, int]) -> int | None:
    """The pool of these hosts when they are all in one (and known to be); None otherwise."""
    found = {pools.get(host_id) for host_id in host_ids}
    return found.pop() if len(found) == 1 else None
