"""Tokens for integrations (django-rest-knox: hashed at rest, expiring, revocable) and who am I."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from knox import views as knox_views
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.authentication import BasicAuthentication, TokenAuthentication
from opsplanner.permissions import user_actions, user_roles

TOKEN_ANSWER = inline_serializer(
    "TokenAnswer", {"token": serializers.CharField(), "expiry": serializers.DateTimeField(allow_null=True)}
)


class LoginView(knox_views.LoginView):
    """Exchange a username and password (HTTP Basic) or a browser session for an API token."""

    authentication_classes = [BasicAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses=TOKEN_ANSWER)
    def post(self, request: Any, format: Any = None) -> Response:
        return super().post(request, format=format)


class LogoutView(knox_views.LogoutView):
    """Revoke the token this request carries."""

    authentication_classes = [TokenAuthentication]  # knox's, without the per-request sweep
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Any, format: Any = None) -> Response:
        return super().post(request, format=format)


class LogoutAllView(knox_views.LogoutAllView):
    """Revoke every token of this user."""

    authentication_classes = [TokenAuthentication]  # knox's, without the per-request sweep
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Any, format: Any = None) -> Response:
        return super().post(request, format=format)


class MeView(APIView):
    """The caller's username, roles and what they may do."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        responses=inline_serializer(
            "Me",
            {
                "username": serializers.CharField(),
                "roles": serializers.ListField(child=serializers.CharField()),
                "actions": serializers.ListField(child=serializers.CharField()),
            },
        )
    )
    def get(self, request: Any) -> Response:
        return Response(
            {
                "username": request.user.get_username(),
                "roles": sorted(user_roles(request.user)),
                "actions": sorted(user_actions(request.user)),
            }
        )
