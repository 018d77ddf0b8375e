"""What the templates may ask about the user: `can.operate`, `can.approve`, … from the one check."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from opsplanner.models import Approval, ApprovalState
from opsplanner.permissions import Action, user_can, user_roles


def live_socket_available() -> bool:
    """Pushes reach browsers only through a channel layer shared by every process (Redis); the
    in-memory layer of the embedded default never sees the workers' changes, so pages poll there."""
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return "InMemory" not in backend


def permissions(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    can = {action.value: user_can(user, action) for action in Action}
    context: dict[str, Any] = {"can": can, "roles": sorted(user_roles(user)), "live_socket": live_socket_available()}
    if can[Action.APPROVE]:
        context["pending_approvals"] = Approval.objects.filter(state=ApprovalState.PENDING).count()
    return context
