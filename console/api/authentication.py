"""Token authentication (django-rest-knox) without the per-request sweep of the user's other
tokens: knox reads all of them on every request to delete expired ones; housekeeping does that
instead. The token itself is still refused (and deleted) once expired."""

from __future__ import annotations

from django.utils import timezone
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import AuthToken


class TokenAuthentication(KnoxTokenAuthentication):
    def _cleanup_token(self, auth_token: AuthToken) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False
