"""The Celery application. Tasks are thin: they carry ids and call service functions."""

import os

from celery import Celery

from config.embedded_broker import embedded_broker_register
from config.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

embedded_broker_register()  # the embedded default's broker (opsqlite://), before any connection
app = Celery("opsplanner")
# Celery reads the settings lazily, deep in its command-line parsing: load them first, so a
# configuration mistake is one line, not a traceback.
app.on_configure.connect(lambda **_: settings_or_exit(), weak=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
