"""Rate limits per token (an integration's token), or per user for browser sessions."""

from __future__ import annotations

import logging
from typing import Any

from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


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

    def allow_request(self, request: Any, view: Any) -> bool:
        # The counters live in the cache (Redis in production); if it is down, rate limiting pauses
        # rather than the API: the work itself lives in PostgreSQL.
        try:
            return super().allow_request(request, view)
        except Exception as error:  # noqa: BLE001 - any cache failure
            log.warning("rate limiting skipped: the cache is unavailable (%s)", error)
            return True
