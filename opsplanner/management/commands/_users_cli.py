"""Shared by the user commands (user_add, user_role, user_disable, token_create): who acts from a
shell, and a service's refusal as one line (never a traceback)."""

from __future__ import annotations

import getpass

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError


def cli_actor() -> str:
    """The actor recorded for a command run from a shell: `cli:<os user>`."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no login name, e.g. a container user without a passwd entry
        name = "unknown"
    return f"cli:{name}"


def refused(error: ValidationError) -> CommandError:
    """One line saying why, with every reason the service gave."""
    return CommandError("refused: " + " ".join(message.rstrip(".") + "." for message in error.messages))
