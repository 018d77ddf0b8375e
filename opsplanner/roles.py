"""Roles are groups. The API, the UI and the websockets ask the same question of them (issue: roles)."""

from __future__ import annotations

from django.contrib.auth.models import Group


class Role:
    OPERATOR = "operator"
    SERVICE_OWNER = "service_owner"
    VIEWER = "viewer"
    EXECUTOR = "executor"

    ALL = (OPERATOR, SERVICE_OWNER, VIEWER, EXECUTOR)


def roles_ensure() -> dict[str, Group]:
    """Create the role groups that do not exist yet; harmless to call again."""
    return {name: Group.objects.get_or_create(name=name)[0] for name in Role.ALL}
