"""Which hosts run (or would run) lower-level versions their job-facing versions do not work with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fleet.models import CompatibilityRule, ComponentLayer, ComponentVersion, InstalledVersion
from opsplanner.prepared import IDS, PreparedModels, PreparedQuery


@dataclass(frozen=True)
class _Installed:
    component_id: int
    component: str
    layer: str
    version_id: int
    version: str
    sort_key: str


class PlannedHosts(NamedTuple):
    """Hosts to check as if they ran `planned` (versions of other components than they run stay)."""

    host_ids: Sequence[int]
    planned: Sequence[ComponentVersion] = ()


_Rules = dict[int, dict[int, list[CompatibilityRule]]]  # job-facing version -> lower component -> rules


def host_incompatibilities(
    host_ids: Iterable[int], *, planned: Iterable[ComponentVersion] = ()
) -> dict[int, list[str]]:
    """{host_id: [reason, …]} for hosts that break a compatibility rule; compatible hosts are absent.

    `planned` versions replace what the hosts run of those components, to ask "would this upgrade
    break a rule?" before it is created (hosts_incompatibilities for one group)."""
    return hosts_incompatibilities([PlannedHosts(list(host_ids), list(planned))])[0]


def hosts_incompatibilities(groups: Sequence[PlannedHosts]) -> list[dict[int, list[str]]]:
    """host_incompatibilities of each group, all in three queries at most: the hosts' job-facing
    versions, the rules those (and the planned ones) pin, then only the lower-level components the
    rules name. A host runs dozens of components, and the admission and the return gate ask about
    every host they consider, for every target version pending (one group each)."""
    ids = sorted({host_id for group in groups for host_id in group.host_ids})
    if not ids:
        return [{} for _ in groups]
    overrides = [[_installed_row(version) for version in group.planned] for group in groups]
    job_facing = _installed(_JOB_FACING.rows(ids=ids))
    pinned = {row.version_id for rows in job_facing.values() for row in rows.values()}
    pinned |= {row.version_id for rows in overrides for row in rows if row.layer == ComponentLayer.JOB_FACING}
    rules: _Rules = defaultdict(lambda: defaultdict(list))
    for rule in _RULES_PINNED_BY.objects(ids=pinned):
        rules[rule.job_facing_version_id][rule.lower_component_id].append(rule)
    if not rules:
        return [{} for _ in groups]
    named = {component_id for by_component in rules.values() for component_id in by_component}
    lower = _installed(_OF_COMPONENTS.rows(ids=ids, components=named))
    results = []
    for group, planned in zip(groups, overrides, strict=True):
        planned_job = {row.component_id: row for row in planned if row.layer == ComponentLayer.JOB_FACING}
        planned_lower = {row.component_id: row for row in planned if row.component_id in named}
        problems = {}
        for host_id in group.host_ids:
            reasons = _reasons(
                {**job_facing.get(host_id, {}), **planned_job}, {**lower.get(host_id, {}), **planned_lower}, rules
            )
            if reasons:
                problems[host_id] = reasons
        results.append(problems)
    return results


def _reasons(job_facing: dict[int, _Installed], installed: dict[int, _Installed], rules: _Rules) -> list[str]:
    """Why one host's lower-level versions break the rules its job-facing versions pin; [] when none."""
    reasons = []
    for pinned in job_facing.values():
        for component_id, allowed in rules.get(pinned.version_id, {}).items():
            ranges = ", ".join(f"[{r.min_version or 'any'}, {r.max_version or 'any'}]" for r in allowed)
            component = allowed[0].lower_component.name
            actual = installed.get(component_id)
            if actual is None:
                reasons.append(
                    f"{pinned.component} {pinned.version} needs {component} in {ranges}; the host has none installed"
                )
            elif not any(rule.allows(actual.sort_key) for rule in allowed):
                reasons.append(
                    f"{component} {actual.version} does not work with {pinned.component} {pinned.version} "
                    f"(needs {ranges})"
                )
    return reasons


def _installed_row(version: ComponentVersion) -> _Installed:
    component = version.component
    return _Installed(component.pk, component.name, component.layer, version.pk, version.version, version.sort_key)


_INSTALLED_COLUMNS = (
    "host_id", "component_id", "component__name", "component__layer", "version_id", "version__version",
    "version__sort_key",
)  # fmt: skip
# Asked by every admission and return gate: compiled once (opsplanner/prepared.py).
_RULES_PINNED_BY = PreparedModels(
    lambda *, ids: CompatibilityRule.objects.filter(job_facing_version_id__any=ids).select_related("lower_component"),
    ids=IDS,
)
_JOB_FACING = PreparedQuery(
    lambda *, ids: (
        InstalledVersion.objects.filter(host_id__any=ids, component__layer=ComponentLayer.JOB_FACING)
        .order_by()
        .values_list(*_INSTALLED_COLUMNS)
    ),
    ids=IDS,
)
_OF_COMPONENTS = PreparedQuery(
    lambda *, ids, components: (
        InstalledVersion.objects.filter(host_id__any=ids, component_id__any=components)
        .order_by()
        .values_list(*_INSTALLED_COLUMNS)
    ),
    ids=IDS,
    components=IDS,
)


def _installed(rows: Iterable[tuple[Any, ...]]) -> dict[int, dict[int, _Installed]]:
    """{host_id: {component_id: installed}} of the rows read (_INSTALLED_COLUMNS)."""
    hosts: dict[int, dict[int, _Installed]] = defaultdict(dict)
    for host_id, component_id, name, layer, version_id, version, key in rows:
        hosts[host_id][component_id] = _Installed(component_id, name, layer, version_id, version, key)
    return hosts
