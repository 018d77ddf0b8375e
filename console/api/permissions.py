"""The API's permission class: a thin adapter over opsplanner.permissions.user_can."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from opsplanner.permissions import Action, user_can


class RolePermission(BasePermission):
    """Each viewset maps its actions to an Action (`action_permissions`); reads default to READ and
    writes to OPERATE. Unauthenticated requests are 401, authenticated ones without the role 403."""

    message = "Your role does not allow this."

    def has_permission(self, request: Any, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        return user_can(request.user, required_action(request, view))


def required_action(request: Any, view: Any) -> Action:
    mapping: dict[str, Action] = getattr(view, "action_permissions", {})
    action = getattr(view, "action", None)
    if action in mapping:
        return mapping[action]
    if "*" in mapping:
        return mapping["*"]
    return Action.READ if request.method in SAFE_METHODS else Action.OPERATE
