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


def roles_ensure_after_migrate(*, using: str = "default", **kwargs: object) -> None:
    """post_migrate receiver (connected for the opsplanner app in OpsPlannerConfig.ready): every
    install has the role groups once migrated, so users can be given a role without a demo."""
    for name in Role.ALL:
        Group.objects.using(using).get_or_create(name=name)
