"""What the templates may ask about the user: `can.operate`, `can.approve`, … from the one check."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from opsplanner.models import Approval, ApprovalState
from opsplanner.permissions import Action, user_can, user_roles


def permissions(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    can = {action.value: user_can(user, action) for action in Action}
    context: dict[str, Any] = {"can": can, "roles": sorted(user_roles(user))}
    if can[Action.APPROVE]:
        context["pending_approvals"] = Approval.objects.filter(state=ApprovalState.PENDING).count()
    return context
