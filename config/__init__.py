"""The project's configuration: settings, URLs, ASGI, the Celery app, the embedded broker, the supervisor.

It wires the apps together and is imported by none of them (they read settings through django.conf)."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
