"""The Celery application. Tasks are thin: they carry ids and call service functions."""

import os

from celery import Celery

from config.embedded_broker import embedded_broker_register

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

embedded_broker_register()  # the embedded default's broker (opsqlite://), before any connection
app = Celery("opsplanner")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
