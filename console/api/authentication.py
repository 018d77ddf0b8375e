"""Token authentication (django-rest-knox) without the per-request sweep of the user's other
tokens: knox reads all of them on every request to delete expired ones; housekeeping does that
instead. The token itself is still refused (and deleted) once expired. HTTP Basic refuses a NUL in
the credentials as wrong credentials (PostgreSQL refuses it in a query: a 500).

Passwords: `LoginLimitBackend` (settings.AUTHENTICATION_BACKENDS) stops checking a user's password
from one client address after LOGIN_FAILURES_LIMIT wrong ones in a row from it, and from every
address after LOGIN_FAILURES_LIMIT_ALL_ADDRESSES, for every surface that takes one (HTTP Basic on
/api/auth/login/, the login page, the admin). Per address, so that someone who knows a username
cannot lock its user out from everywhere with a few wrong passwords; across addresses too, so that
guesses spread over many addresses stay bounded."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, NamedTuple

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


class _FailureKeys(NamedTuple):
    """The cache keys counting a user's wrong passwords: from every address, and from this one."""

    everywhere: str
    here: str


def _failures_keys(username: str, request: HttpRequest | None) -> _FailureKeys | None:
    """None for an unknown username (nothing to guess). The keys hash the stored password too, so a
    password change starts new counts. Behind a balancer every client has the balancer's address:
    both limits then apply to everyone at once, as the one count did before."""
    stored = get_user_model().objects.filter(username=username).values_list("password", flat=True).first()
    if stored is None:
        return None
    user = hashlib.sha256(f"{username}\x00{stored}".encode()).hexdigest()
    address = (request.META.get("REMOTE_ADDR") if request is not None else "") or ""
    return _FailureKeys(
        everywhere=f"login-failures:{user}",
        here=f"login-failures:{user}:" + hashlib.sha256(address.encode()).hexdigest()[:32],
    )


def _locked_out(keys: _FailureKeys) -> bool:
    return (
        _failures(keys.here) >= settings.LOGIN_FAILURES_LIMIT
        or _failures(keys.everywhere) >= settings.LOGIN_FAILURES_LIMIT_ALL_ADDRESSES
    )


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
    """Django's ModelBackend that refuses a user, whatever the password then, after
    settings.LOGIN_FAILURES_LIMIT wrong passwords in a row from the client's address, or
    LOGIN_FAILURES_LIMIT_ALL_ADDRESSES from any (each within LOGIN_FAILURES_WINDOW_SECONDS of the last one).
    DRF's throttles run only after authentication, so without this a wrong password, refused while
    authenticating, was never counted and a password could be guessed at full speed."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        username = username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        keys = _failures_keys(username, request)
        if keys is not None and _locked_out(keys):
            raise PermissionDenied  # authenticate() stops here: no other backend is asked
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if keys is not None:
            for key in keys:
                _failures_count(key, failed=user is None)
        return user
