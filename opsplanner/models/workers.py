"""Worker liveness: each Celery worker stamps its row from the periodic heartbeat task."""

from django.db import models


class WorkerHeartbeat(models.Model):
    worker = models.CharField(max_length=255, unique=True, help_text="Celery node name")
    last_seen_at = models.DateTimeField()
    pid = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.worker} @ {self.last_seen_at:%H:%M:%S}"
