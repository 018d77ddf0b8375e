"""OpenAPI authentication schemes (drf-spectacular), imported at startup from OpsPlannerConfig.ready.

The API accepts knox tokens (`Authorization: Token <key>`, through our TokenAuthentication, the
logout views included) and the session cookie. Without an extension for our TokenAuthentication
subclass spectacular drops it, and the schema would claim every operation is cookie-only.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.authentication import BasicScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object

TOKEN_SCHEME = "tokenAuth"


class TokenAuthScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.authentication.TokenAuthentication"
    name = TOKEN_SCHEME

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            **build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token"),
            "description": "An integration token from POST /api/auth/login/, sent as `Authorization: Token <key>`.",
        }


class BasicAuthScheme(BasicScheme):
    """HTTP Basic for the login, through our subclass (which refuses a NUL): spectacular's own
    extension matches DRF's class only."""

    target_class = "console.api.authentication.BasicAuthentication"
