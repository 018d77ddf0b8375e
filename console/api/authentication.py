"""Token authentication (django-rest-knox) without the per-request sweep of the user's other
tokens: knox reads all of them on every request to delete expired ones; housekeeping does that
instead. The token itself is still refused (and deleted) once expired. HTTP Basic refuses a NUL in
the credentials as wrong credentials (PostgreSQL refuses it in a query: a 500).

Passwords: `LoginLimitBackend` (settings.AUTHENTICATION_BACKENDS) stops checking a user's password
after LOGIN_FAILURES_LIMIT wrong ones in a row, for every surface that takes one (HTTP Basic on
/api/auth/login/, the login page, the admin)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext as _
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import AuthToken
from rest_framework import authentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

log = logging.getLogger(__name__)


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


def _failures_key(username: str) -> str | None:
    """The cache key counting a user's wrong passwords, None for an unknown username (nothing to
    guess). It hashes the stored password too, so a password change starts a new count."""
    stored = get_user_model().objects.filter(username=username).values_list("password", flat=True).first()
    if stored is None:
        return None
    return "login-failures:" + hashlib.sha256(f"{username}\x00{stored}".encode()).hexdigest()


def _failures(key: str) -> int:
    try:
        return int(cache.get(key) or 0)
    except Exception as error:  # noqa: BLE001 - any cache failure: logins go on, uncounted
        log.warning("login failures not read: the cache is unavailable (%s)", error)
        return 0


def _failures_count(key: str, *, failed: bool) -> None:
    """One more wrong password (the count lives LOGIN_FAILURES_WINDOW_SECONDS after the last one),
    or a right one, which starts the count again."""
    window = settings.LOGIN_FAILURES_WINDOW_SECONDS
    try:
        if not failed:
            cache.delete(key)
        elif not cache.add(key, 1, window):
            cache.incr(key)  # atomic: guesses sent at once are all counted
            cache.touch(key, window)
    except Exception as error:  # noqa: BLE001 - any cache failure (or the count expired meanwhile)
        log.warning("login failure not counted: the cache is unavailable (%s)", error)


class LoginLimitBackend(ModelBackend):
    """Django's ModelBackend that refuses a user after settings.LOGIN_FAILURES_LIMIT wrong passwords
    in a row (within LOGIN_FAILURES_WINDOW_SECONDS of the last one), whatever the password then.
    DRF's throttles run only after authentication, so without this a wrong password, refused while
    authenticating, was never counted and a password could be guessed at full speed."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        username = username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        key = _failures_key(username)
        if key is not None and _failures(key) >= settings.LOGIN_FAILURES_LIMIT:
            raise PermissionDenied  # authenticate() stops here: no other backend is asked
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if key is not None:
            _failures_count(key, failed=user is None)
        return user
