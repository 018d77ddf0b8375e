"""Upgrades and their rollout phases; offboarding and re-onboarding."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, F, IntegerField, OuterRef, Q, QuerySet
from django.db.models.expressions import Expression, ExpressionWrapper
from django.db.models.functions import Coalesce
from django.db.models.lookups import IsNull

from fleet.models import ComponentVersion, Host, InstalledVersion, MaintenanceDomain, Pool
from opsplanner import clock
from opsplanner.events import Actor, actor_fields, actor_user, event_record
from opsplanner.models import (
    HostTask,
    TaskState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedModels, PreparedQuery
from opsplanner.scopes import parse_scope, resolve_scope, version_of
from opsplanner.services.compatibility import target_refusal
from trains.limits import FAILURE_RATE_DECIMALS, check_deadline, check_visit_bound
from trains.models import LIVE_TRAIN_STATES, Train, Upgrade, UpgradePhase, UpgradeState, VisitOperation
from trains.models.upgrades import DEFAULT_UPGRADE_PRIORITY, PhaseSelection
from trains.services.budget import train_budget_check
from trains.services.phase_hosts import (
    ByCarrying,
    CountUpTo,
    carried_hosts,
    failed_hosts,
    hosts_in,
    not_carried,
    phase_row,
    phases_hosts,
    rows_in,
    with_carried,
)

SUBJECT = "trains.upgrade"
# Failures that say nothing about the upgrade itself (the drainer refused, the return failed, the
# host runs a version another upgrade of its drain installed and was withdrawn since; a task
# superseded by a newer version, which is cancelled, not failed, so never counted anyway): decided
# by the task's failure code, never by its reason's wording.
NOT_THE_UPGRADES_FAULT = frozenset(
    {FailureCode.DRAIN_FAILED, FailureCode.RETURN_FAILED, FailureCode.RUNS_WITHDRAWN, FailureCode.SUPERSEDED}
)


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    domain: str = ""
    percent: int | None = None
    min_successes: int = 1
    soak_s: int = 0
    selection: str = PhaseSelection.FIXED


def _phase_specs(raw: list[dict[str, Any]] | None) -> list[PhaseSpec]:
    if raw is None:
        return [PhaseSpec(name="all", percent=100, min_successes=0)]
    if not raw:
        raise ValidationError({"phases": "Give at least one phase (or none for a single phase over the scope)."})
    specs = []
    for i, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            raise ValidationError({"phases": f"Phase {i} must be an object."})
        unknown = set(item) - {"name", "domain", "percent", "min_successes", "soak_s", "selection"}
        if unknown:
            raise ValidationError({"phases": f"Phase {i} has unknown fields: {', '.join(sorted(unknown))}."})
        domain, percent = item.get("domain") or "", item.get("percent")
        if bool(domain) == (percent is not None):
            raise ValidationError({"phases": f"Phase {i} is either one domain or a percentage of the scope."})
        if percent is not None and (not isinstance(percent, int) or not 1 <= percent <= 100):
            raise ValidationError({"phases": f"Phase {i}: percent is a whole number from 1 to 100."})
        for field in ("min_successes", "soak_s"):
            value = item.get(field, 1 if field == "min_successes" else 0)
            if not isinstance(value, int) or value < 0:
                raise ValidationError({"phases": f"Phase {i}: {field} is a whole number, 0 or more."})
        selection = item.get("selection", PhaseSelection.FIXED)
        if selection not in PhaseSelection.values:
            raise ValidationError(
                {"phases": f"Phase {i}: selection is 'fixed' (only its own scope) or 'any' (any hosts of the pool)."}
            )
        if i < len(raw) and item.get("min_successes", 1) < 1:
            raise ValidationError(
                {"phases": f"Phase {i} comes before the last: it needs at least one success before the rollout widens."}
            )
        specs.append(
            PhaseSpec(
                name=str(item.get("name") or f"phase {i}")[:63],
                domain=str(domain),
                percent=percent,
                min_successes=item.get("min_successes", 1),
                soak_s=item.get("soak_s", 0),
                selection=selection,
            )
        )
    _check_phase_order(specs)
    return specs


def _check_phase_order(specs: list[PhaseSpec]) -> None:
    """Phases widen: canary domains first, then strictly growing percentages, ending at 100%."""
    seen_percent = 0
    for i, spec in enumerate(specs, start=1):
        if spec.domain and seen_percent:
            raise ValidationError(
                {"phases": f"Phases out of order: phase {i} ({spec.name}) is one domain after a {seen_percent}% phase."}
            )
        if spec.percent is not None:
            if spec.percent <= seen_percent:
                raise ValidationError(
                    {
                        "phases": f"Phases out of order: phase {i} ({spec.name}) covers {spec.percent}%, "
                        f"not more than the {seen_percent}% before it."
                    }
                )
            seen_percent = spec.percent
    if seen_percent != 100:
        raise ValidationError({"phases": "The last phase must cover the whole scope (100%)."})


def phase_host_sets(phases: list[UpgradePhase], scope_ids: list[int]) -> list[set[int]]:
    """The hosts each phase allows (each includes the earlier phases' hosts)."""
    domains = [p.domain_id for p in phases if p.domain_id]
    in_domain: dict[int, set[int]] = {d: set() for d in domains}
    if domains:  # percentage phases need no query
        for host_id, domain_id in Host.objects.filter(pk__any=scope_ids, domain_id__in=domains).values_list(
            "id", "domain_id"
        ):
            in_domain[domain_id].add(host_id)
    allowed: set[int] = set()
    sets = []
    for phase in phases:
        if phase.domain_id:
            allowed |= in_domain[phase.domain_id]
        else:
            allowed |= set(scope_ids[: math.ceil(len(scope_ids) * (phase.percent or 0) / 100)])
        sets.append(set(allowed))
    return sets


@transaction.atomic
def upgrade_create(
    *,
    pool: Pool,
    component: str,
    version: str,
    reason: str,
    scope: str = "",
    phases: list[dict[str, Any]] | None = None,
    max_failures: int = 2,
    max_failure_rate: float | None = None,
    failure_rate_min_hosts: int = 5,
    multi_cycle: bool = False,
    hosts_per_visit: int | None = None,
    emergency: bool = False,
    priority: int = DEFAULT_UPGRADE_PRIORITY,
    deadline: dt.datetime | None = None,
    duration_s: int | None = None,
    actor: Actor = None,
) -> Upgrade:
    """Create an upgrade for the pool's train, or refuse with the reason (nothing is written). The
    train says at once if the upgrade cannot fit one of its visits, or if a deadline cannot be met."""
    target = _checked_request(
        reason=reason, component=component, version=version, multi_cycle=multi_cycle,
        hosts_per_visit=hosts_per_visit, max_failure_rate=max_failure_rate,
    )  # fmt: skip
    specs = _phase_specs(phases)
    scope = (scope or f"pool {pool.name}").strip()
    _, label = actor_fields(actor)
    upgrade = Upgrade(
        pool=pool,
        component_version=target,
        scope=scope,
        reason=reason.strip()[:500],
        emergency=emergency,
        max_failures=max_failures,
        max_failure_rate=None if max_failure_rate is None else Decimal(str(max_failure_rate)),
        failure_rate_min_hosts=failure_rate_min_hosts,
        multi_cycle=multi_cycle,
        hosts_per_visit=hosts_per_visit,
        priority=priority,
        deadline=deadline,
        duration_s=duration_s,
        requested_by=actor_user(actor),
        requester=label,
        created_at=clock.now(),
    )
    upgrade.full_clean()
    check_deadline(deadline, now=upgrade.created_at)
    scope_ids = _checked_scope(pool, scope, target)
    upgrade.save()
    UpgradePhase.objects.bulk_create(_phase_rows(upgrade, specs, scope_ids))
    event_record(
        kind="upgrade.created",
        subject=upgrade,
        actor=actor,
        reason=upgrade.reason,
        pool_id=pool.pk,
        data={"target": str(target), "scope": scope, "hosts": len(scope_ids), "phases": [s.name for s in specs],
              "emergency": emergency, "priority": priority, "deadline": deadline.isoformat() if deadline else None},
    )  # fmt: skip
    if not emergency:
        train_says_at_once(pool)
    return upgrade


def _checked_request(
    *,
    reason: str,
    component: str,
    version: str,
    multi_cycle: bool,
    hosts_per_visit: int | None,
    max_failure_rate: float | None,
) -> ComponentVersion:
    """The target version, once the request's own fields make sense together."""
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why this upgrade is needed."})
    try:
        target = version_of(component, version)
    except ValidationError as unknown:  # named under the request's own field, in the API as in the form
        raise ValidationError({"version": unknown.message_dict["component_version"]}) from None
    if target.withdrawn_at is not None:
        raise ValidationError({"version": f"{target} is withdrawn: {target.withdrawn_reason}"})
    check_visit_bound(multi_cycle=multi_cycle, hosts_per_visit=hosts_per_visit)
    if max_failure_rate is not None and not 0 <= max_failure_rate <= 1:
        raise ValidationError({"max_failure_rate": "The failure rate is between 0 and 1."})
    if max_failure_rate is not None and round(max_failure_rate, FAILURE_RATE_DECIMALS) != max_failure_rate:
        # Rounded, 0.00004 became 0: the first failure offboarded the upgrade.
        raise ValidationError(
            {"max_failure_rate": f"The failure rate has at most {FAILURE_RATE_DECIMALS} decimal places."}
        )
    return target


def _checked_scope(pool: Pool, scope: str, target: ComponentVersion) -> list[int]:
    """The scope's hosts, all in the pool, none left incompatible by the target."""
    scope_ids = sorted(resolve_scope(parse_scope(scope)))
    outside = Host.objects.filter(pk__any=scope_ids).exclude(pool=pool).count()
    if outside:
        raise ValidationError({"scope": f"{outside} hosts of the scope are not in pool {pool.name}."})
    refusal = target_refusal(scope_ids, target)
    if refusal is not None:
        raise refusal.error("version")
    return scope_ids


def _phase_rows(upgrade: Upgrade, specs: list[PhaseSpec], scope_ids: list[int]) -> list[UpgradePhase]:
    """The phases as rows, each able to show its evidence (a domain phase has hosts in scope; a
    phase can reach its successes)."""
    domains = {d.name: d for d in MaintenanceDomain.objects.filter(pool=upgrade.pool)}
    rows = []
    for position, spec in enumerate(specs):
        if spec.domain and spec.domain not in domains:
            raise ValidationError(
                {"phases": f"Phase {spec.name}: pool {upgrade.pool.name} has no domain {spec.domain}."}
            )
        rows.append(
            UpgradePhase(
                upgrade=upgrade,
                position=position,
                name=spec.name,
                domain=domains.get(spec.domain) if spec.domain else None,
                percent=spec.percent,
                min_successes=spec.min_successes,
                soak_s=spec.soak_s,
                selection=spec.selection,
                started_at=upgrade.created_at if position == 0 else None,
            )
        )
    before: set[int] = set()
    for phase, allowed in zip(rows, phase_host_sets(rows, scope_ids), strict=True):
        new = len(allowed - before)
        if new == 0 and phase.domain is not None:
            raise ValidationError({"phases": f"Phase {phase.name}: domain {phase.domain.name} has no host in scope."})
        # An 'any' phase may take the hosts it lacks from the rest of the scope.
        offered = len(scope_ids) - len(before) if phase.selection == PhaseSelection.ANY else new
        if phase.min_successes > offered:
            verb = "can take" if phase.selection == PhaseSelection.ANY else "adds"
            wanted = phase.min_successes
            raise ValidationError(
                {"phases": f"Phase {phase.name} {verb} {offered} hosts; it cannot wait for {wanted} successes."}
            )
        before = allowed
    return rows


def train_says_at_once(pool: Pool) -> None:
    """The pool's train checks at once that every active upgrade fits one of its visits, gives the new
    one its promise, and the forecast that every deadline is met (alerts otherwise), rather than when a
    cycle misses: as an upgrade is created, and as the train's SLO, concurrency or stops change."""
    from trains.services.upgrade_forecast import upgrades_forecast_check

    train = Train.objects.filter(pool=pool, emergency=False, state__in=LIVE_TRAIN_STATES).select_related("pool").first()
    if train is None:
        return
    active = list(
        Upgrade.objects.filter(pool=pool, emergency=False, state=UpgradeState.ACTIVE).select_related(
            "component_version"
        )
    )
    train_budget_check(train=train, upgrades=active)
    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())


def upgrade_tasks(upgrade: Upgrade, *, phase: int | None = None) -> QuerySet[HostTask]:
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=upgrade)
    return tasks if phase is None else tasks.filter(operation__visit_link__phase=phase)


def _phase_operations() -> QuerySet[VisitOperation, Any]:
    """The operations of a phase, for a subquery of a subquery on UpgradePhase rows. Straight from
    the visits' links: joined through the operations table, PostgreSQL hashed every operation ever
    made at each count (a cost that grew with the run)."""
    return VisitOperation.objects.filter(
        upgrade_id=OuterRef(OuterRef("upgrade_id")), phase=OuterRef(OuterRef("position"))
    ).values("operation_id")


def _counted_failures(depth: int) -> QuerySet[HostTask, Any]:
    """The failed tasks that count against an upgrade in a phase, for a subquery `depth` queries
    below UpgradePhase rows (see phase_failures): its own operations' that failed since it
    (re)started and, once it has started, the earlier phases' operations' that failed since then. A
    task of an earlier phase that failed after that phase graduated (a catch-up linked to it) counted
    against no phase, and the rollout went on widening."""
    position, started = phase_row("position", depth + 1), phase_row("started_at", depth + 1)
    operations = VisitOperation.objects.filter(upgrade_id=phase_row("upgrade_id", depth + 1)).filter(
        Q(phase=position) | Q(IsNull(started, False), phase__lt=position)
    )
    return (
        HostTask.objects.filter(operation_id__in=operations.values("operation_id"), state=TaskState.FAILED)
        .filter(Q(IsNull(phase_row("started_at", depth), True)) | Q(finished_at__gte=phase_row("started_at", depth)))
        .exclude(failure_code__in=sorted(NOT_THE_UPGRADES_FAULT))
    )


def phase_failures() -> Expression:
    """The failures that count against an upgrade in a phase, as an expression on UpgradePhase rows
    (the one definition: the train tick and offboarding count with it, the pages with it bounded by
    phase_failures_while_in_force). A failed task of the phase's operations counts if it failed
    since the phase (re)started (a re-onboarded phase counts from its restart) and its failure code
    is the upgrade's fault (see NOT_THE_UPGRADES_FAULT);
    so does one of an earlier phase's operations that failed since (_counted_failures).
    The policy says how many hosts may fail: a host counts once however often it failed (its catch-up
    and each later cycle retry it), or one bad host offboarded a rollout the rest of the pool took.
    A what-if lane's phase counts the hosts its live copy had counted failed too (failed_hosts)."""
    return failed_hosts(_counted_failures(depth=1))


def phase_failures_while_in_force() -> Expression:
    """phase_failures as it stood while the phase was in force, as an expression on UpgradePhase rows
    (the pages show each phase's count with it): for a phase not graduated, phase_failures itself;
    for a graduated one, only the failures before it graduated. A later failure of its tasks (a
    catch-up) counts against the phase in force then, from its start (the next phase's graduation
    time): shown with phase_failures, it showed in its own phase too, once per phase since."""
    graduated = OuterRef("graduated_at")
    failed = _counted_failures(depth=1).filter(Q(IsNull(graduated, True)) | Q(finished_at__lt=graduated))
    return failed_hosts(failed)


def upgrade_phase_failures(upgrade: Upgrade, phase: UpgradePhase) -> int:
    """The failures counted against one upgrade in `phase` (by phase_failures, as the tick counts)."""
    return upgrades_phase_failures([upgrade], {upgrade.pk: phase}).get(upgrade.pk, 0)


_PHASES = PreparedModels(
    lambda *, ids: UpgradePhase.objects.filter(upgrade_id__any=ids).order_by("upgrade_id", "position"), ids=IDS
)


def upgrades_phases(upgrades: list[Upgrade]) -> dict[int, list[UpgradePhase]]:
    """Each upgrade's phases in order (one query)."""
    phases: dict[int, list[UpgradePhase]] = defaultdict(list)
    for phase in _PHASES.objects(ids=[u.pk for u in upgrades]):
        phases[phase.upgrade_id].append(phase)
    return phases


def upgrades_phase_failures(upgrades: list[Upgrade], current: dict[int, UpgradePhase]) -> dict[int, int]:
    """Failures in each upgrade's current phase, as phase_failures counts them (one query)."""
    return dict(_PHASE_FAILURES.get().rows(ids=[current[u.pk].pk for u in upgrades]))


def _at_or_beyond(path: str, *, component: Any, sort_key: Any) -> Q:
    """An installed version (at `path` from the rows filtered, "" for InstalledVersion rows) of
    `component` at or beyond `sort_key` (values, or references to the enclosing queries): the one
    definition of a host that runs an upgrade's target or a newer release of its component. A withdrawn
    release is not one (offboarded, it is rolled back: counted, the older upgrade completed and the
    host ended below it)."""
    return Q(
        **{
            f"{path}component_id": component,
            f"{path}version__sort_key__gte": sort_key,
            f"{path}version__withdrawn_at__isnull": True,
        }
    )


def _below(host_ids: Iterable[int], *, component: Any, sort_key: Any) -> QuerySet[Host]:
    """The hosts among `host_ids` below the target `component` at `sort_key` (see _at_or_beyond)."""
    reached = InstalledVersion.objects.filter(
        _at_or_beyond("", component=component, sort_key=sort_key), host_id=OuterRef("pk")
    )
    return Host.objects.filter(pk__any=sorted(host_ids)).filter(~Exists(reached))


def hosts_below_target(upgrade: Upgrade, host_ids: Iterable[int]) -> QuerySet[Host]:
    """The hosts among `host_ids` that run neither the upgrade's target nor a newer version of its
    component (a newer release that reached a host first supersedes the upgrade there)."""
    target = upgrade.component_version
    return _below(host_ids, component=target.component_id, sort_key=target.sort_key)


def upgrades_hosts_below(upgrades: Iterable[Upgrade], host_ids: Iterable[int]) -> dict[int, set[int]]:
    """Per upgrade, the hosts among `host_ids` below its target (as hosts_below_target says), in one
    query for all of them: a visit asks it of every active upgrade as it starts (it asked one
    query per upgrade, and a backlog grows)."""
    hosts = set(host_ids)
    ids = [u.pk for u in upgrades]
    reached: dict[int, set[int]] = defaultdict(set)
    if hosts and ids:
        # An installed version of each upgrade's component, reached through the component's versions
        # to the upgrades that target one of them.
        rows = InstalledVersion.objects.filter(
            _at_or_beyond(
                "", component=F("component__versions__component_id"), sort_key=F("component__versions__sort_key")
            ),
            host_id__any=sorted(hosts),
            component__versions__upgrades__id__any=ids,
        ).values_list("component__versions__upgrades__id", "host_id")
        for upgrade_id, host_id in rows:
            reached[upgrade_id].add(host_id)
    return {upgrade_id: hosts - reached[upgrade_id] for upgrade_id in ids}


def upgrades_unfinished(upgrades: Iterable[Upgrade], host_ids: Iterable[int]) -> set[int]:
    """The upgrades among these that still have a host of `host_ids` below their target (as
    hosts_below_target says), in one query: the train tick asks it of every active upgrade."""
    below = _below(
        host_ids,
        component=OuterRef(OuterRef("component_version__component_id")),
        sort_key=OuterRef(OuterRef("component_version__sort_key")),
    )
    ids = [u.pk for u in upgrades]
    if not ids:
        return set()
    return set(Upgrade.objects.filter(pk__any=ids).filter(Exists(below)).values_list("id", flat=True))


def _phase_succeeded_tasks() -> QuerySet[HostTask, Any]:
    """The finished tasks of a phase's operations whose host succeeded (see phase_successes), for a
    subquery on UpgradePhase rows."""
    # A task is done when its host is back in service; one handed over, when its drain brought the
    # host back (drain_returned_at).
    return HostTask.objects.filter(
        Q(state=TaskState.DONE) | Q(state=TaskState.HANDED_OVER, drain_returned_at__isnull=False),
        _at_or_beyond(
            "host__installed_versions__",
            component=OuterRef("upgrade__component_version__component_id"),
            sort_key=OuterRef("upgrade__component_version__sort_key"),
        ),
        operation_id__in=_phase_operations(),
    ).order_by()


def phase_successes() -> Coalesce:
    """The hosts that succeeded in a phase, as an expression on UpgradePhase rows (the one
    definition: the train tick and the pages count with it). A host counts once if a task of the
    phase's operations finished (done, or handed over with the work applied), the host came back
    to service from that task's drain, and it runs the target or a newer version of the component
    (a newer release that reached it supersedes the upgrade). A host that is out again since (drained
    for later work, broken) still counts: it succeeded, and the failure rate must not rise because a
    later visit drained the hosts that proved the upgrade (it offboarded good upgrades)."""
    return hosts_in(_phase_succeeded_tasks())


def _rate_succeeded_tasks() -> QuerySet[HostTask, Any]:
    """The succeeded tasks of a phase whose host has no failure counted against it in the phase: a
    host that failed then caught up finished once, as a failure (counted as a success too, one
    finished host was two, and its catch-up could push the rate over the policy)."""
    return _phase_succeeded_tasks().filter(~Exists(_counted_failures(depth=2).filter(host_id=OuterRef("host_id"))))


def phase_rate_successes() -> Expression:
    """The successes the failure rate counts in a phase (see _rate_succeeded_tasks), as an expression
    on UpgradePhase rows: with the failures, each finished host once (a what-if lane's phase with the
    hosts its live copy counted, _rate_successes_with_carried)."""
    return _rate_successes_with_carried(hosts_in)


def phase_rate_successes_up_to(cap: int) -> Expression:
    """phase_rate_successes with its tasks counted up to `cap`: exact below it, at least `cap` at or
    above it (a what-if lane's carried successes are added to the capped count: more successes, still
    within the rate)."""

    def capped(tasks: QuerySet[HostTask, Any]) -> Expression:  # the SQL of the count alone
        return ExpressionWrapper(CountUpTo(tasks.values("host_id").distinct(), cap), output_field=IntegerField())

    return _rate_successes_with_carried(capped)


def _rate_successes_with_carried(count: Callable[[QuerySet[HostTask, Any]], Expression]) -> Expression:
    """`count` of the hosts that succeeded in a phase (_rate_succeeded_tasks); for a what-if lane's
    phase (with_carried), each host once over its own tasks and the hosts its live copy counted, as
    live: a success of the rate is a host that succeeded in the phase with no failure counted against
    it, live or in the lane (one that failed live and succeeds in the lane finished as a failure)."""
    tasks = _rate_succeeded_tasks()
    lane = count(not_carried(tasks, 1))  # a host the phase carries counts as carried, if at all
    failed_in_lane = _counted_failures(depth=2).filter(host_id=OuterRef("host_id"))
    carried = rows_in(carried_hosts(1, failed=False).filter(~Exists(failed_in_lane)))
    return with_carried(count(tasks), lane + carried)


def upgrade_phase_successes(upgrade: Upgrade, phase: int) -> int:
    """The successes of one upgrade's phase at `phase` (as the tick counts them)."""
    return upgrades_phase_successes(list(UpgradePhase.objects.filter(upgrade=upgrade, position=phase))).get(
        upgrade.pk, 0
    )


def upgrades_phase_successes(phases: list[UpgradePhase]) -> dict[int, int]:
    """{upgrade: successes} of each of these phases (by phase_successes), in one query: the train
    tick asks it of every upgrade that has a phase to open."""
    if not phases:
        return {}
    return dict(_PHASE_SUCCESSES.get().rows(ids=[phase.pk for phase in phases]))


def upgrades_rate_successes(phases: list[UpgradePhase], *, up_to: int | None) -> dict[int, int]:
    """{upgrade: successes the failure rate counts} of each of these phases (phase_rate_successes), in
    one query: the train tick asks it of every upgrade whose failures could breach its rate. With
    `up_to`, each is counted only up to that many (phase_rate_successes_up_to): the rate needs no
    more, and an upgrade late in its rollout has a pool's worth of successes to read."""
    if not phases:
        return {}
    ids = [phase.pk for phase in phases]
    if up_to is None:
        return dict(_PHASE_RATE_SUCCESSES.get().rows(ids=ids))
    return dict(_PHASE_RATE_SUCCESSES_UP_TO.get().rows(ids=ids, cap=up_to))


def upgrades_failed_hosts(phases: list[UpgradePhase]) -> dict[int, set[int]]:
    """{upgrade: the hosts phase_failures counts of its own tasks} of each of these phases, in one
    query: what a what-if's snapshot carries of the live phase in force (phases_hosts)."""
    return phases_hosts(phases, lambda: _counted_failures(depth=1))


def upgrades_rate_succeeded_hosts(phases: list[UpgradePhase]) -> dict[int, set[int]]:
    """{upgrade: the hosts phase_rate_successes counts of its own tasks} of each of these phases, in
    one query (as upgrades_failed_hosts)."""
    return phases_hosts(phases, _rate_succeeded_tasks)


def _per_phase(count: Callable[[], Expression]) -> ByCarrying[PreparedQuery]:
    """{upgrade: count} of the phases asked for, by `count` (phase_failures, phase_successes, ...); the
    train tick asks both of its upgrades' current phases every tick: compiled once (opsplanner/prepared.py)."""
    return ByCarrying(
        lambda: PreparedQuery(
            lambda *, ids: (
                UpgradePhase.objects.filter(pk__any=ids).order_by().annotate(n=count()).values_list("upgrade_id", "n")
            ),
            ids=IDS,
        )
    )


_PHASE_FAILURES = _per_phase(phase_failures)
_PHASE_SUCCESSES = _per_phase(phase_successes)
_PHASE_RATE_SUCCESSES = _per_phase(phase_rate_successes)
_PHASE_RATE_SUCCESSES_UP_TO = ByCarrying(
    lambda: PreparedQuery(
        lambda *, ids, cap: (
            UpgradePhase.objects.filter(pk__any=ids)
            .order_by()
            .annotate(n=phase_rate_successes_up_to(cap))
            .values_list("upgrade_id", "n")
        ),
        ids=IDS,
        cap=int,
    )
)
