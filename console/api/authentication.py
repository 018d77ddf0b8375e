"""Token authentication (django-rest-knox) without the per-request sweep of the user's other
tokens: knox reads all of them on every request to delete expired ones; housekeeping does that
instead. The token itself is still refused (and deleted) once expired. HTTP Basic refuses a NUL in
the credentials as wrong credentials (PostgreSQL refuses it in a query: a 500)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import AuthToken
from rest_framework import authentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request


class TokenAuthentication(KnoxTokenAuthentication):
    def _cleanup_token(self, auth_token: AuthToken) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False


class BasicAuthentication(authentication.BasicAuthentication):
    def authenticate_credentials(self, userid: str, password: str, request: Request | None = None) -> Any:
        if "\x00" in userid or "\x00" in password:
            raise AuthenticationFailed(_("Invalid username/password."))  # DRF's own answer to wrong ones
        return super().authenticate_credentials(userid, password, request)
