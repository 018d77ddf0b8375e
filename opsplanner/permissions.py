"""The one permission check: the API, the UI and the websocket consumers all ask `user_can`.

Roles are groups (opsplanner.roles). What each may do:
- operator: read everything, every operational action, decide approvals (never their own);
- service owner: read the fleet, and manage opt-out windows and reservations of the services they own;
- viewer: read the fleet;
- executor: claim, heartbeat and report on external work items, and nothing else.
A superuser is an operator. Objects outside a user's scope are filtered out of their querysets, so
the API answers 404 for them, not 403.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet

from opsplanner.roles import Role


class Action(StrEnum):
    READ = "read"  # the fleet, operations, trains, events
    OPERATE = "operate"  # submit and cancel operations, trains, upgrades, emergency requests
    APPROVE = "approve"  # decide approval requests
    MANAGE_OWN_SERVICE = "manage_own_service"  # opt-out windows and reservations of owned services
    EXECUTE = "execute"  # claim and report work items


ROLE_ACTIONS: dict[str, frozenset[Action]] = {
    Role.OPERATOR: frozenset({Action.READ, Action.OPERATE, Action.APPROVE, Action.MANAGE_OWN_SERVICE}),
    Role.SERVICE_OWNER: frozenset({Action.READ, Action.MANAGE_OWN_SERVICE}),
    Role.VIEWER: frozenset({Action.READ}),
    Role.EXECUTOR: frozenset({Action.EXECUTE}),
}


def user_roles(user: Any) -> frozenset[str]:
    """The user's roles, read once per request object (cached on the user)."""
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated or not user.is_active:
        return frozenset()
    cached = getattr(user, "_opsplanner_roles", None)
    if cached is None:
        names = set(user.groups.filter(name__in=Role.ALL).values_list("name", flat=True))
        if user.is_superuser:
            names.add(Role.OPERATOR)
        cached = frozenset(names)
        user._opsplanner_roles = cached
    return cached


def user_actions(user: Any) -> frozenset[Action]:
    actions: set[Action] = set()
    for role in user_roles(user):
        actions |= ROLE_ACTIONS.get(role, frozenset())
    return frozenset(actions)


def user_can(user: Any, action: Action | str, obj: Any = None) -> bool:
    """May `user` do `action` (on `obj`, when the action is about one object)?"""
    actions = user_actions(user)
    action = Action(action)
    if action not in actions:
        return False
    if action is Action.MANAGE_OWN_SERVICE and obj is not None and Role.OPERATOR not in user_roles(user):
        service_id = getattr(obj, "service_id", None) or getattr(obj, "pk", None)
        return service_id in owned_service_ids(user)
    return True


def owned_service_ids(user: Any) -> set[int]:
    cached = getattr(user, "_opsplanner_owned", None)
    if cached is None:
        cached = set(user.owned_services.values_list("pk", flat=True)) if user_roles(user) else set()
        user._opsplanner_owned = cached
    return cached


def services_visible_to(user: Any, queryset: QuerySet, *, field: str = "service") -> QuerySet:
    """Rows about services: operators see all of them for writing, owners only their own."""
    if Role.OPERATOR in user_roles(user):
        return queryset
    if Role.SERVICE_OWNER in user_roles(user):
        lookup = "pk__in" if field == "self" else f"{field}__in"
        return queryset.filter(**{lookup: owned_service_ids(user)})
    return queryset.none()
