"""What the embedded default (SQLite plus the filesystem broker) needs on disk before it starts."""

from pathlib import Path

from django.conf import settings


def prepare_var_dir() -> None:
    """Create the folders the SQLite file, static files and the filesystem broker use. Harmless when present."""
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing
    if settings.REDIS_URL is None:
        for key in ("data_folder_in", "data_folder_out", "processed_folder"):
            Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS[key]).mkdir(parents=True, exist_ok=True)
