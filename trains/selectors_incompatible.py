"""Where the visits refuse an upgrade as incompatible, for the per-upgrade forecast
(trains/selectors_forecast.py).

A visit submits each upgrade it takes as one step over the domain's hosts; the core refuses a step
whose target would break a compatibility rule on any of its hosts (a rule made after the upgrade
was, or a host's versions changed since), and the visit leaves the upgrade out with an event
(trains/services/visits.py: visit_steps_submit_compatible). Every visit to that domain does the same
until a rule or the hosts' versions change: no visit reaches any of the upgrade's hosts there, the
compatible ones included. So the forecast plays none of them: it names them (`Incompatible`), and an
upgrade with such hosts is `incompatible` (no cycle or date for every host, no promise; a deadline is
not met), saying when the visits reach its other hosts.

Cost: the upgrades query flags, with two EXISTS of its own (no query more), the upgrades a rule could
refuse (`RULE_MAY_REFUSE`): a lower-level target that some job-facing version's rules leave out, or a
job-facing target that pins rules. Only when one is flagged, five queries at most for all of them:
the pools' hosts, which of them are below each target, and the compatibility pass the core makes
(fleet.selectors.compatibility.hosts_incompatibilities, three at most); a flagged upgrade whose scope
is narrower than its pool adds its scope's (one or two).

Approximations: a host that already breaks a rule about another component (every target is refused
there) is not looked for; the hosts the upgrade's current phase does not allow yet count (phases are
assumed to graduate on time); a multi-cycle upgrade's visit is taken to include an incompatible host
of its domain; and an older release the refused one supersedes is still played there (the visit gives
the hosts to the newer release, which it refuses).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import suppress
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q

from fleet.models import CompatibilityRule, Host, HostState
from fleet.selectors.compatibility import PlannedHosts, hosts_incompatibilities
from trains.models import Upgrade
from trains.services.upgrade_scopes import scope_host_ids, scope_is_pool
from trains.services.upgrades import upgrades_hosts_below

RULE_MAY_REFUSE = "rule_may_refuse"  # the annotation `rule_may_refuse()` gives the upgrades query


def rule_may_refuse() -> ExpressionWrapper:
    """Whether some compatibility rule could make the core refuse the upgrade's target: one of its
    lower-level component that no rule of the same job-facing version lets the target through, or
    one pinned by the target itself (a job-facing version). For an Upgrade query (no query)."""
    key = OuterRef(OuterRef("component_version__sort_key"))
    allowing = CompatibilityRule.objects.filter(
        Q(min_key="") | Q(min_key__lte=key),
        Q(max_key="") | Q(max_key__gte=key),
        job_facing_version_id=OuterRef("job_facing_version_id"),
        lower_component_id=OuterRef("lower_component_id"),
    )
    excluding = CompatibilityRule.objects.filter(lower_component_id=OuterRef("component_version__component_id"))
    pinned = CompatibilityRule.objects.filter(job_facing_version_id=OuterRef("component_version_id"))
    return ExpressionWrapper(
        Q(Exists(excluding.filter(~Exists(allowing)))) | Q(Exists(pinned)), output_field=BooleanField()
    )


class Refused(NamedTuple):
    """Where the visits refuse an upgrade: per domain, how many of its hosts below the target would
    break a rule with it; and why, on the first of them."""

    breaking: dict[int, int]
    why: str


def upgrades_refused(upgrades: list[Upgrade]) -> dict[int, Refused]:
    """Per upgrade flagged by `rule_may_refuse` whose target would break a rule on some of its hosts
    below it (not escalated: those are counted apart), where (see the module's docstring for the
    cost; none without a flagged upgrade)."""
    flagged = [u for u in upgrades if getattr(u, RULE_MAY_REFUSE, False)]
    if not flagged:
        return {}
    hosts = list(
        Host.objects.filter(pool_id__in=sorted({u.pool_id for u in flagged}))
        .exclude(state=HostState.ESCALATED)
        .values_list("id", "pool_id", "domain_id")
    )
    domain_of = {host_id: domain_id for host_id, _, domain_id in hosts}
    below = upgrades_hosts_below(flagged, domain_of)
    groups = []
    for upgrade in flagged:
        ids = _in_scope(
            upgrade, {host_id for host_id, pool_id, _ in hosts if pool_id == upgrade.pool_id} & below[upgrade.pk]
        )
        for release in _newer_releases(upgrade, upgrades):
            # A visit gives these hosts (below this target, so below the newer one) to the newer release
            # (visits.domain_steps), which reaches this one too: its target is never submitted there.
            # (A refused newer release is its own case.)
            ids -= _in_scope(release, ids)
        groups.append(PlannedHosts(sorted(ids), [upgrade.component_version]))
    refused = {}
    for upgrade, problems in zip(flagged, hosts_incompatibilities(groups), strict=True):
        if problems:
            breaking: dict[int, int] = defaultdict(int)
            for host_id in problems:
                breaking[domain_of[host_id]] += 1
            refused[upgrade.pk] = Refused(dict(breaking), problems[min(problems)][0])
    return refused


def _newer_releases(upgrade: Upgrade, upgrades: list[Upgrade]) -> list[Upgrade]:
    """The active releases of the upgrade's component in its pool newer than its target."""
    version = upgrade.component_version
    return [
        u
        for u in upgrades
        if u.pool_id == upgrade.pool_id
        and u.component_version.component_id == version.component_id
        and u.component_version.sort_key > version.sort_key
    ]


def _in_scope(upgrade: Upgrade, ids: set[int]) -> set[int]:
    """Of `ids`, the hosts in the upgrade's scope (one or two queries for a scope narrower than its pool)."""
    if ids and not scope_is_pool(upgrade):
        with suppress(ValidationError):  # a scope that does not parse reads as its whole pool (selectors_pending)
            return ids & set(scope_host_ids(upgrade))
    return ids


class Incompatible(NamedTuple):
    """An upgrade's hosts below its target that no visit reaches (every host below it, not escalated,
    in the domains where the visits refuse it); how many of them would break a rule; why; the domains."""

    hosts: int
    breaking: int
    why: str
    domains: int


def refused_out(
    refused: Refused | None, pending: dict[int, int], broken: dict[int, int]
) -> tuple[dict[int, int], dict[int, int], Incompatible | None]:
    """The upgrade's hosts pending per domain and those out broken, less the domains where the visits
    refuse it; and those it leaves out (None: nothing refused)."""
    if refused is None:
        return pending, broken, None
    hosts = sum(pending.get(d, 0) + broken.get(d, 0) for d in refused.breaking)
    incompatible = Incompatible(hosts, sum(refused.breaking.values()), refused.why, len(refused.breaking))
    kept = {d: n for d, n in pending.items() if d not in refused.breaking}
    return kept, {d: n for d, n in broken.items() if d not in refused.breaking}, incompatible


def incompatible_text(incompatible: Incompatible, *, others: int, others_when: str) -> str:
    """What the forecast says of an upgrade the visits refuse on some hosts; `others`: its hosts they
    reach, and when ("by cycle N, around <date>", or beyond the forecast's horizon)."""
    of = f"its {incompatible.hosts}" if not others else f"{incompatible.hosts} of its {incompatible.hosts + others}"
    domains = "its domain" if incompatible.domains == 1 else f"their {incompatible.domains} domains"
    text = (
        f"cannot be scheduled on {of} hosts below the target: its target would break a compatibility rule on "
        f"{incompatible.breaking} of them ({incompatible.why}), and every visit to {domains} refuses it until a "
        "rule or the hosts' versions change"
    )
    if others:
        text += f"; reaches the {others} others {others_when}"
    return text
