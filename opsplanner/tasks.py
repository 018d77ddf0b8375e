"""Celery tasks: thin callers of services. They carry ids only and re-read state, so a redelivered
task is harmless (late acks, prefetch 1 in settings)."""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.core.exceptions import ValidationError

from opsplanner.services import simulator
from opsplanner.services.housekeeping import (
    expired_tokens_delete,
    idempotency_records_purge,
    resubmissions_left_sweep,
)
from opsplanner.services.operation_cancel import resubmissions_left_cancel as resubmissions_left_cancel_service
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
    return idempotency_records_purge() + expired_tokens_delete() + resubmissions_left_sweep()


# A conflict (its family changed while it took the pools' locks) is tried again: nothing was written.
@shared_task(
    name="opsplanner.tasks.resubmissions_left_cancel",
    autoretry_for=(ValidationError,),
    retry_backoff=True,
    max_retries=8,
)
def resubmissions_left_cancel(operation_id: int) -> int:
    """The open resubmissions a tick's cancel of this operation left (their tasks in another pool),
    cancelled after its commit; harmless twice."""
    return resubmissions_left_cancel_service(operation_id=operation_id)
