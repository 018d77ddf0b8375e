"""Which hosts run lower-level versions their job-facing versions do not work with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from fleet.models import CompatibilityRule, ComponentLayer, InstalledVersion


def host_incompatibilities(host_ids: Iterable[int]) -> dict[int, list[str]]:
    """{host_id: [reason, …]} for the hosts that break a compatibility rule; compatible hosts are absent.

    Set-based: one query for the hosts' installed versions and one for the rules that apply.
    """
    ids = list(host_ids)
    if not ids:
        return {}
    installed = (
        InstalledVersion.objects.filter(host_id__in=ids)
        .select_related("version", "component")
        .only("host_id", "component__name", "component__layer", "version__version", "version__sort_key")
    )
    job_facing: dict[int, list[InstalledVersion]] = defaultdict(list)
    lower: dict[tuple[int, int], InstalledVersion] = {}
    for row in installed:
        if row.component.layer == ComponentLayer.JOB_FACING:
            job_facing[row.host_id].append(row)
        else:
            lower[(row.host_id, row.component_id)] = row
    version_ids = {row.version_id for rows in job_facing.values() for row in rows}
    rules: dict[tuple[int, int], list[CompatibilityRule]] = defaultdict(list)
    for rule in CompatibilityRule.objects.filter(job_facing_version_id__in=version_ids).select_related(
        "lower_component"
    ):
        rules[(rule.job_facing_version_id, rule.lower_component_id)].append(rule)

    problems: dict[int, list[str]] = defaultdict(list)
    for host_id, pinned_rows in job_facing.items():
        for pinned in pinned_rows:
            for (version_id, component_id), allowed in rules.items():
                if version_id != pinned.version_id:
                    continue
                actual = lower.get((host_id, component_id))
                component_name = allowed[0].lower_component.name
                ranges = ", ".join(f"[{r.min_version or 'any'}, {r.max_version or 'any'}]" for r in allowed)
                if actual is None:
                    problems[host_id].append(
                        f"{pinned.component.name} {pinned.version.version} needs {component_name} in {ranges}; "
                        "the host has none installed"
                    )
                elif not any(rule.allows(actual.version.sort_key) for rule in allowed):
                    problems[host_id].append(
                        f"{component_name} {actual.version.version} does not work with "
                        f"{pinned.component.name} {pinned.version.version} (needs {ranges})"
                    )
    return dict(problems)
