"""What the embedded default (SQLite plus the SQLite broker) needs on disk before it starts."""

from pathlib import Path

from django.conf import settings


def prepare_var_dir() -> None:
    """Create the folders the SQLite files, logs and static files use. Harmless when present."""
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    (settings.VAR_DIR / "log").mkdir(exist_ok=True)
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing
