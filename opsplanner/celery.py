"""The Celery application. Tasks are thin: they carry ids and call service functions."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsplanner.settings")

app = Celery("opsplanner")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
