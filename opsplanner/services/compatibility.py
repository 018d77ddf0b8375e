"""The one refusal of a target version that would break a compatibility rule, asked before an
operation or an upgrade is created (the tick asks again per task: services/tick/checks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.core.exceptions import ValidationError

from fleet.models import ComponentVersion, Host
from fleet.selectors.compatibility import PlannedHosts, hosts_incompatibilities
from opsplanner.models.operations import WaitingCode


class Refusal(NamedTuple):
    """Why a write is refused: a code for decisions, a message for people."""

    code: str
    message: str

    def error(self, field: str) -> ValidationError:
        """The refusal as the service raises it, on the form field it concerns."""
        return ValidationError({field: ValidationError(self.message, code=self.code)})


def target_refusal(host_ids: Sequence[int], target: ComponentVersion) -> Refusal | None:
    """The refusal when upgrading these hosts to `target` would break a compatibility rule on any
    of them, naming the first such host and rule; None when it would not (two or three queries)."""
    return targets_refusals([PlannedHosts(host_ids, [target])])[0]


def targets_refusals(groups: Sequence[PlannedHosts]) -> list[Refusal | None]:
    """target_refusal for each group (hosts, [their one target]), all in one compatibility pass:
    a batch of submissions checks every target at once."""
    refusals: list[Refusal | None] = []
    for group, problems in zip(groups, hosts_incompatibilities(groups), strict=True):
        if not problems:
            refusals.append(None)
            continue
        host_id, reasons = next(iter(problems.items()))
        hostname = Host.objects.only("hostname").get(pk=host_id).hostname
        refusals.append(
            Refusal(
                code=WaitingCode.INCOMPATIBLE.value,
                message=f"{group.planned[0]} would break a compatibility rule on {len(problems)} of "
                f"{len(group.host_ids)} hosts, e.g. {hostname}: {reasons[0]}.",
            )
        )
    return refusals


def withdrawn_refusal(version: ComponentVersion) -> Refusal | None:
    """The refusal of a withdrawn version as a target, naming why it was withdrawn; None when it is
    not withdrawn. The code is Django's default ("invalid"), as these refusals always had."""
    if version.withdrawn_at is None:
        return None
    return Refusal(code="invalid", message=f"{version} is withdrawn: {version.withdrawn_reason}")
