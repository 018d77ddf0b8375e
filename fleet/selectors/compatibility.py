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
    break a rule?" before it is created. Set-based: one query for installed versions, one for rules.
    """
    ids = list(host_ids)
    if not ids:
        return {}
    hosts: dict[int, dict[int, _Installed]] = defaultdict(dict)
    rows = InstalledVersion.objects.filter(host_id__any=ids).values_list(
        "host_id", "component_id", "component__name", "component__layer", "version_id", "version__version",
        "version__sort_key",
    )  # fmt: skip
    for host_id, component_id, name, layer, version_id, version, key in rows:
        hosts[host_id][component_id] = _Installed(component_id, name, layer, version_id, version, key)
    overrides = [
        _Installed(v.component_id, v.component.name, v.component.layer, v.pk, v.version, v.sort_key) for v in planned
    ]
    for host_id in ids:
        for override in overrides:
            hosts[host_id][override.component_id] = override

    pinned_versions = {
        row.version_id
        for versions in hosts.values()
        for row in versions.values()
        if row.layer == ComponentLayer.JOB_FACING
    }
    rules: dict[int, dict[int, list[CompatibilityRule]]] = defaultdict(lambda: defaultdict(list))
    for rule in CompatibilityRule.objects.filter(job_facing_version_id__in=pinned_versions).select_related(
        "lower_component"
    ):
        rules[rule.job_facing_version_id][rule.lower_component_id].append(rule)

    problems: dict[int, list[str]] = {}
    for host_id, installed in hosts.items():
        reasons = []
        for pinned in installed.values():
            if pinned.layer != ComponentLayer.JOB_FACING:
                continue
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
