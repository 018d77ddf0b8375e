"""Users, their role and their API tokens, written without the admin: a new install gets its first
operator (and its service owners, viewers and executors) from the command line.

A user holds exactly one role group (opsplanner.roles); a service owner's scope is the services
they own (`fleet.Service.owners`, read by `opsplanner.permissions.owned_service_ids`). Each write is
one transaction with its event, whose subject is the user. Refusals are ValidationErrors whose code
says why: `invalid` (a role, a password, a TTL), `not_found` (a user, a service), `conflict` (a
name taken, a user already disabled, too many tokens).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model, password_validation
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from knox.models import AuthToken
from knox.settings import knox_settings

from fleet.models import Service
from opsplanner.events import Actor, event_record
from opsplanner.roles import Role

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL, what get_user_model() returns

MAX_TOKEN_TTL = dt.timedelta(days=366)


@dataclass(frozen=True)
class UserDisabled:
    user: User
    tokens_revoked: int
    sessions_ended: int


@dataclass(frozen=True)
class TokenCreated:
    user: User
    token: str  # the secret, shown once: only its hash is stored
    expiry: dt.datetime | None


def _refusal(field: str, message: str, code: str) -> ValidationError:
    return ValidationError({field: ValidationError(message, code=code)})


def _role_group(role: str) -> Group:
    if role not in Role.ALL:
        raise _refusal("role", f"unknown role {role!r}; the roles are {', '.join(Role.ALL)}", "invalid")
    return Group.objects.get_or_create(name=role)[0]


def _services_named(names: Sequence[str], *, role: str) -> list[Service]:
    """The services a service owner is to own, all of them known, or a refusal naming the others."""
    wanted = sorted(set(names))
    if wanted and role != Role.SERVICE_OWNER:
        raise _refusal("services", f"only a {Role.SERVICE_OWNER} owns services, not a {role}", "invalid")
    found = list(Service.objects.filter(name__in=wanted).order_by("name"))
    missing = sorted(set(wanted) - {service.name for service in found})
    if missing:
        raise _refusal("services", f"unknown service(s): {', '.join(missing)}", "not_found")
    return found


def _user_named(username: str, *, lock: bool = False) -> User:
    users = get_user_model().objects.all()
    if lock:
        users = users.select_for_update()
    try:
        return users.get(username=username)
    except get_user_model().DoesNotExist:
        raise _refusal("username", f"no user named {username!r}", "not_found") from None


def _password_check(password: str, user: User) -> None:
    """Django's password validators (settings.AUTH_PASSWORD_VALIDATORS); a refusal lists every reason."""
    if not password:
        raise _refusal("password", "the password is empty", "invalid")
    try:
        password_validation.validate_password(password, user)
    except ValidationError as error:
        raise ValidationError({"password": error.error_list}) from None


def _role_names(user: User) -> list[str]:
    return sorted(user.groups.filter(name__in=Role.ALL).values_list("name", flat=True))


def _owned_names(user: User) -> list[str]:
    return sorted(user.owned_services.values_list("name", flat=True))


@transaction.atomic
def user_add(
    *,
    username: str,
    role: str,
    password: str | None = None,
    email: str = "",
    services: Sequence[str] = (),
    actor: Actor,
) -> User:
    """Create a user with exactly `role` (owning `services` if a service owner). Without a
    password the user gets an unusable one: token only, until someone sets one."""
    group = _role_group(role)
    owned = _services_named(services, role=role)
    user_model = get_user_model()
    if user_model.objects.filter(username=username).exists():
        raise _refusal("username", f"a user named {username!r} already exists; change their role instead", "conflict")
    user = user_model(username=username, email=email)
    user.set_unusable_password()
    user.full_clean()
    if password is not None:
        _password_check(password, user)
        user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError:  # created by someone else since the check above
        raise _refusal("username", f"a user named {username!r} already exists", "conflict") from None
    user.groups.set([group])
    user.owned_services.set(owned)
    event_record(
        kind="user.created",
        subject=user,
        actor=actor,
        data={
            "username": username,
            "role": role,
            "services": [service.name for service in owned],
            "password": "set" if password is not None else "unusable",
        },
    )
    return user


@transaction.atomic
def user_role_set(*, username: str, role: str, services: Sequence[str] | None = None, actor: Actor) -> User:
    """Replace the user's role group by `role` (other, non-role groups stay). A service owner's
    services become `services` when given (else stay); any other role owns no service."""
    group = _role_group(role)
    owned = _services_named(services or (), role=role)
    user = _user_named(username, lock=True)
    roles_before, owned_before = _role_names(user), _owned_names(user)
    user.groups.remove(*Group.objects.filter(name__in=Role.ALL).exclude(pk=group.pk))
    user.groups.add(group)
    if role != Role.SERVICE_OWNER:
        user.owned_services.clear()
    elif services is not None:
        user.owned_services.set(owned)
    event_record(
        kind="user.role_changed",
        subject=user,
        actor=actor,
        data={
            "username": username,
            "roles_before": roles_before,
            "role": role,
            "services_before": owned_before,
            "services": _owned_names(user),
        },
    )
    return user


def _sessions_end(user: User) -> int:
    """Delete the user's sessions from a database-backed session store (the default); other
    stores cannot be searched, and a deactivated user's session no longer authenticates anyway."""
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store_class, "get_model_class"):
        return 0
    user_id = str(user.pk)
    live = store_class.get_model_class().objects.filter(expire_date__gt=timezone.now())
    ended = 0
    for session in live.iterator():
        if str(session.get_decoded().get(SESSION_KEY)) == user_id:
            store_class(session.session_key).delete()
            ended += 1
    return ended


@transaction.atomic
def user_disable(*, username: str, reason: str = "", actor: Actor) -> UserDisabled:
    """Deactivate the user, revoke every API token and end their sessions."""
    user = _user_named(username, lock=True)
    if get_user_model().objects.filter(pk=user.pk, is_active=True).update(is_active=False) != 1:
        raise _refusal("username", f"user {username!r} is already disabled", "conflict")
    user.is_active = False
    tokens_revoked, _ = AuthToken.objects.filter(user=user).delete()
    sessions_ended = _sessions_end(user)
    event_record(
        kind="user.disabled",
        subject=user,
        actor=actor,
        reason=reason.strip(),
        data={"username": username, "tokens_revoked": tokens_revoked, "sessions_ended": sessions_ended},
    )
    return UserDisabled(user=user, tokens_revoked=tokens_revoked, sessions_ended=sessions_ended)


def _token_ttl(ttl: dt.timedelta | None) -> dt.timedelta | None:
    if ttl is None:
        return knox_settings.TOKEN_TTL
    if not dt.timedelta(0) < ttl <= MAX_TOKEN_TTL:
        hours = int(MAX_TOKEN_TTL.total_seconds() // 3600)
        raise _refusal("ttl", f"a token lives more than 0 and at most {hours} hours", "invalid")
    return ttl


@transaction.atomic
def token_create(
    *, username: str, ttl: dt.timedelta | None = None, description: str = "", actor: Actor
) -> TokenCreated:
    """A knox API token for an active user, under the same per-user limit as the login endpoint.
    The event records who, for how long and what for, never the token."""
    expires_in = _token_ttl(ttl)
    user = _user_named(username, lock=True)  # the lock serialises the limit check per user
    if not user.is_active:
        raise _refusal("username", f"user {username!r} is disabled", "conflict")
    limit = knox_settings.TOKEN_LIMIT_PER_USER
    live = AuthToken.objects.filter(user=user).filter(Q(expiry__gt=timezone.now()) | Q(expiry__isnull=True))
    if limit is not None and live.count() >= limit:
        raise _refusal("username", f"user {username!r} already has {limit} live tokens, the most allowed", "conflict")
    instance, token = AuthToken.objects.create(user=user, expiry=expires_in)
    event_record(
        kind="user.token_created",
        subject=user,
        actor=actor,
        reason=description.strip(),
        data={
            "username": username,
            "expires_at": instance.expiry.isoformat() if instance.expiry else None,
            "description": description.strip(),
        },
    )
    return TokenCreated(user=user, token=token, expiry=instance.expiry)
