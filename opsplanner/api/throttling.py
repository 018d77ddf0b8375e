"""Rate limits per token (an integration's token), or per user for browser sessions."""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import SimpleRateThrottle


class TokenRateThrottle(SimpleRateThrottle):
    scope = "token"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        auth = getattr(request, "auth", None)
        token_key = getattr(auth, "token_key", None)
        if token_key:
            ident = f"token:{token_key}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
