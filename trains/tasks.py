"""Celery tasks of the trains app: thin callers of the services."""

from celery import shared_task

from trains.services.tick import trains_tick as trains_tick_service


@shared_task(name="trains.tasks.trains_tick")
def trains_tick() -> int:
    """Tick every live train; returns how many were ticked (not skipped, not rolled back)."""
    return sum(1 for report in trains_tick_service() if not report.skipped and not report.rolled_back)
