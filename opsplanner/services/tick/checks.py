"""Checks shared by admission, the end of a drain and handover."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from fleet.models import ComponentVersion
from fleet.selectors.compatibility import PlannedHosts, hosts_incompatibilities
from opsplanner.prepared import IDS, PreparedModels
from opsplanner.services.compatibility import withdrawn_refusal
from opsplanner.services.tick.context import TaskRef

_VERSIONS = PreparedModels(  # asked for every batch the admission considers: compiled once
    lambda *, ids: ComponentVersion.objects.filter(pk__any=ids).select_related("component").order_by(), ids=IDS
)


def _by_target(tasks: Iterable[TaskRef]) -> dict[int, list[TaskRef]]:
    by_target: dict[int, list[TaskRef]] = defaultdict(list)
    for task in tasks:
        if task.target_version_id:
            by_target[task.target_version_id].append(task)
    return by_target


def withdrawn_targets(tasks: Iterable[TaskRef]) -> dict[int, str]:
    """{task_id: reason} for upgrade tasks whose target is withdrawn (one query, none without an
    upgrade): what a drain just done must not install (its upgrade offboarded while it drained)."""
    by_target = _by_target(tasks)
    if not by_target:
        return {}
    reasons: dict[int, str] = {}
    for version in _VERSIONS.objects(ids=set(by_target)):
        withdrawn = withdrawn_refusal(version)
        if withdrawn is not None:
            reasons.update((task.id, withdrawn.message) for task in by_target[version.pk])
    return reasons


def incompatible_targets(tasks: Iterable[TaskRef]) -> dict[int, str]:
    """{task_id: reason} for upgrade tasks whose target would now break a compatibility rule on
    their host (checked at submission too, but the host may have changed since)."""
    by_target = _by_target(tasks)
    reasons: dict[int, str] = {}
    versions = {version.pk: version for version in _VERSIONS.objects(ids=set(by_target))}
    checked: list[list[TaskRef]] = []
    groups: list[PlannedHosts] = []
    for version_id, group in by_target.items():
        withdrawn = withdrawn_refusal(versions[version_id])
        if withdrawn is not None:
            for task in group:
                reasons[task.id] = withdrawn.message
            continue
        checked.append(group)
        groups.append(PlannedHosts([t.host_id for t in group], [versions[version_id]]))
    for group, problems in zip(checked, hosts_incompatibilities(groups), strict=True):  # every target at once
        for task in group:
            if task.host_id in problems:
                reasons[task.id] = f"incompatible: {problems[task.host_id][0]}"
    return reasons
