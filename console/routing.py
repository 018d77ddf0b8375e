"""Websocket routes."""

from django.urls import path

from console.consumers import LiveConsumer

# channels routes Django's path() to an ASGI application; django-stubs' path() knows only views.
websocket_urlpatterns: list = [path("ws/live/", LiveConsumer.as_asgi())]  # type: ignore[arg-type]  # stub gap
