"""Celery tasks of the core: thin callers of service functions."""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from opsplanner.services.workers import worker_heartbeat_record


@shared_task(bind=True, name="opsplanner.tasks.worker_heartbeat")
def worker_heartbeat(self: Any) -> None:
    worker_heartbeat_record(worker=self.request.hostname or "unknown")


@worker_ready.connect
def _stamp_heartbeat_when_ready(sender: Any, **kwargs: Any) -> None:
    """A new worker shows up as live at once, not one beat interval later."""
    worker_heartbeat_record(worker=sender.hostname)
