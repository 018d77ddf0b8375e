"""Which hosts run (or would run) lower-level versions their job-facing versions do not work with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.models import CompatibilityRule, ComponentLayer, ComponentVersion, InstalledVersion


@dataclass(frozen=True)
class _Installed:
    component_id: int
    component: str
    layer: str
    version_id: int
    version: str
    sort_key: str


def host_incompatibilities(
    host_ids: Iterable[int], *, planned: Iterable[ComponentVersion] = ()
) -> dict[int, list[str]]:
    """{host_id: [reason, …]} for hosts that break a compatibility rule; compatible hosts are absent.

    `planned` versions replace what the hosts run of those components, to ask "would this upgrade
    break a rule?" before it is created. Set-based, three queries at most: the hosts' job-facing
    versions, the rules those pin, then only the lower-level components the rules name (a host runs
    dozens of components and the admission and the return gate ask about every host they consider).
    """
    ids = list(host_ids)
    if not ids:
        return {}
    overrides = [
        _Installed(v.component_id, v.component.name, v.component.layer, v.pk, v.version, v.sort_key) for v in planned
    ]
    hosts = _installed(
        ids, [o for o in overrides if o.layer == ComponentLayer.JOB_FACING], layer=ComponentLayer.JOB_FACING
    )
    pinned_versions = {row.version_id for versions in hosts.values() for row in versions.values()}
    rules: dict[int, dict[int, list[CompatibilityRule]]] = defaultdict(lambda: defaultdict(list))
    for rule in CompatibilityRule.objects.filter(job_facing_version_id__in=pinned_versions).select_related(
        "lower_component"
    ):
        rules[rule.job_facing_version_id][rule.lower_component_id].append(rule)
    if not rules:
        return {}
    named = {component_id for by_component in rules.values() for component_id in by_component}
    lower = _installed(ids, [o for o in overrides if o.component_id in named], component_ids=named)

    problems: dict[int, list[str]] = {}
    for host_id, job_facing in hosts.items():
        installed = lower.get(host_id, {})
        reasons = []
        for pinned in job_facing.values():
            for component_id, allowed in rules.get(pinned.version_id, {}).items():
                ranges = ", ".join(f"[{r.min_version or 'any'}, {r.max_version or 'any'}]" for r in allowed)
                component = allowed[0].lower_component.name
                actual = installed.get(component_id)
                if actual is None:
                    reasons.append(
                        f"{pinned.component} {pinned.version} needs {component} in {ranges}; "
                        "the host has none installed"
                    )
                elif not any(rule.allows(actual.sort_key) for rule in allowed):
                    reasons.append(
                        f"{component} {actual.version} does not work with {pinned.component} {pinned.version} "
                        f"(needs {ranges})"
                    )
        if reasons:
            problems[host_id] = reasons
    return problems


def _installed(
    ids: list[int], overrides: list[_Installed], *, layer: str | None = None, component_ids: set[int] | None = None
) -> dict[int, dict[int, _Installed]]:
    """{host_id: {component_id: installed}} of one layer or of the named components, with the planned
    versions (already of that layer or those components) in place of what the hosts run."""
    rows = InstalledVersion.objects.filter(host_id__any=ids)
    if layer is not None:
        rows = rows.filter(component__layer=layer)
    if component_ids is not None:
        rows = rows.filter(component_id__in=component_ids)
    hosts: dict[int, dict[int, _Installed]] = defaultdict(dict)
    for host_id, component_id, name, row_layer, version_id, version, key in rows.values_list(
        "host_id", "component_id", "component__name", "component__layer", "version_id", "version__version",
        "version__sort_key",
    ):  # fmt: skip
        hosts[host_id][component_id] = _Installed(component_id, name, row_layer, version_id, version, key)
    if overrides:
        planned = {override.component_id: override for override in overrides}
        for host_id in ids:
            hosts[host_id].update(planned)
    return hosts
