"""Websocket routes."""

from django.urls import path

from opsplanner.consumers import LiveConsumer

websocket_urlpatterns: list = [path("ws/live/", LiveConsumer.as_asgi())]
