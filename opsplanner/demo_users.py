"""Demo logins for the embedded default: two operators (for the two-person rule), a service owner,
a viewer and an executor (for the API walk-through). Only in DEBUG; the password is random per
installation, kept in var/ and printed."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from fleet.models import Service
from opsplanner.roles import Role, roles_ensure

DEMO_USERS: tuple[tuple[str, str, bool], ...] = (
    # (username, role, staff: may use the admin)
    ("operator", Role.OPERATOR, True),
    ("operator2", Role.OPERATOR, True),
    ("owner", Role.SERVICE_OWNER, False),
    ("viewer", Role.VIEWER, False),
    ("executor", Role.EXECUTOR, False),
)
OWNED_BY_DEMO_OWNER = ("llm-pretrain", "genai-serving")


@dataclass(frozen=True)
class DemoLogin:
    username: str
    role: str
    password: str


def credentials_file() -> Path:
    return settings.VAR_DIR / "demo-credentials.txt"


def _demo_password() -> str:
    path = credentials_file()
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_urlsafe(12)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(password + "\n")
    path.chmod(0o600)
    return password


@transaction.atomic
def demo_users_ensure() -> list[DemoLogin]:
    """Create the demo users (or reset their password to the one in var/ if it differs); return their logins."""
    if not settings.DEBUG:
        raise ImproperlyConfigured("Demo users exist only with DEBUG on; create real users with createsuperuser.")
    groups = roles_ensure()
    password = _demo_password()
    user_model = get_user_model()
    logins = []
    for username, role, staff in DEMO_USERS:
        user, _ = user_model.objects.get_or_create(username=username)
        user.is_staff = staff
        user.is_superuser = staff
        # Only a changed password is set again: a new hash (a new salt) changes the session auth hash and
        # would log every browser out at each `serve` start.
        if not user.check_password(password):
            user.set_password(password)
        user.save()
        user.groups.set([groups[role]])
        logins.append(DemoLogin(username=username, role=role, password=password))
    owner = user_model.objects.get(username="owner")
    for service in Service.objects.filter(name__in=OWNED_BY_DEMO_OWNER):
        service.owners.add(owner)
    return logins
