"""What the templates may ask about the user: `can.operate`, `can.approve`, … from the one check."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from opsplanner.permissions import Action, user_can, user_roles


def permissions(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    return {
        "can": {action.value: user_can(user, action) for action in Action},
        "roles": sorted(user_roles(user)),
    }
