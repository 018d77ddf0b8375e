"""Celery tasks: thin callers of services. They carry ids only and re-read state, so a redelivered
task is harmless (late acks, prefetch 1 in settings)."""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from opsplanner.services import simulator
from opsplanner.services.housekeeping import expired_tokens_delete, idempotency_records_purge
from opsplanner.services.tick import fleet_tick
from opsplanner.services.tick import pool_tick as pool_tick_service
from opsplanner.services.workers import worker_heartbeat_record


@shared_task(bind=True, name="opsplanner.tasks.worker_heartbeat")
def worker_heartbeat(self: Any) -> None:
    worker_heartbeat_record(worker=self.request.hostname or "unknown")


@worker_ready.connect
def _stamp_heartbeat_when_ready(sender: Any, **kwargs: Any) -> None:
    """A new worker shows up as live at once, not one beat interval later."""
    worker_heartbeat_record(worker=sender.hostname)


@shared_task(name="opsplanner.tasks.tick")
def tick() -> int:
    """The periodic reconcile of every pool with work; returns how many pools were ticked."""
    return sum(1 for report in fleet_tick() if not report.skipped)


@shared_task(name="opsplanner.tasks.pool_tick")
def pool_tick(pool_id: int) -> None:
    pool_tick_service(pool_id=pool_id)


@shared_task(name="opsplanner.tasks.simulated_work_step")
def simulated_work_step() -> int:
    return simulator.simulated_work_step()


@shared_task(name="opsplanner.tasks.housekeeping")
def housekeeping() -> int:
    return idempotency_records_purge() + expired_tokens_delete()
