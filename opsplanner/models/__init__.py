from opsplanner.models.events import Event
from opsplanner.models.workers import WorkerHeartbeat

__all__ = ["Event", "WorkerHeartbeat"]
