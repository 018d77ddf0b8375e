"""Websocket routes. The live dashboard adds its consumers here."""

websocket_urlpatterns: list = []
