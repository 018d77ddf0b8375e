"""API test helpers: clients that authenticate with real tokens, one per role."""

from __future__ import annotations

from django.contrib.auth.models import User
from knox.models import AuthToken
from rest_framework.test import APIClient

from opsplanner.roles import Role
from tests.trains_builders import make_user


def token_client(user: User) -> APIClient:
    _, token = AuthToken.objects.create(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    client.user = user  # type: ignore[attr-defined]
    return client


def role_client(role: str = Role.OPERATOR) -> APIClient:
    return token_client(make_user(role))
