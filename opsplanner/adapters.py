"""Which adapter does a work item: the names, and which of them execute and which drain.

A pool names its executor and drainer; an operation or a train may override either, and "" means
"the pool's". The tick resolves the name when it writes an item (`TickContext.add_item`), so an item
always carries a concrete adapter, and an undrain goes to the adapter that did the drain."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models


class Adapter(models.TextChoices):
    """Who does the work items: the built-in simulator, our own adapters, or any program through the API."""

    SIMULATED = "simulated", "Simulated"
    EXTERNAL = "external", "External (your own program, through the API)"
    AGENT = "agent", "Host agent"
    SSH = "ssh", "SSH executor"
    SLURM = "slurm", "Slurm drainer"
    KUBERNETES = "kubernetes", "Kubernetes drainer"


# "" on an operation or a train: use the pool's adapter.
POOLS_ADAPTER = ""
EXECUTORS = (Adapter.SIMULATED, Adapter.EXTERNAL, Adapter.AGENT, Adapter.SSH)
DRAINERS = (Adapter.SIMULATED, Adapter.EXTERNAL, Adapter.SLURM, Adapter.KUBERNETES)
EXECUTOR_CHOICES = [(a.value, a.label) for a in EXECUTORS]
DRAINER_CHOICES = [(a.value, a.label) for a in DRAINERS]
# Operations and trains: the pool's, or one of the pool's choices overridden.
EXECUTOR_OVERRIDE_CHOICES = [(POOLS_ADAPTER, "The pool's executor"), *EXECUTOR_CHOICES]
DRAINER_OVERRIDE_CHOICES = [(POOLS_ADAPTER, "The pool's drainer"), *DRAINER_CHOICES]
# Adapters whose items are claimed through the API (everything but the built-in simulator).
API_ADAPTERS = tuple(a for a in Adapter if a != Adapter.SIMULATED)


def adapter_refusal(*, field: str, value: str, allowed: tuple[Adapter, ...], blank: bool) -> ValidationError | None:
    """Why this adapter name cannot be used for that role, or None when it can."""
    if (blank and value == POOLS_ADAPTER) or value in allowed:
        return None
    names = ", ".join(a.value for a in allowed)
    if blank:
        names = f"{names} (or empty for the pool's)"
    role = "an executor" if allowed == EXECUTORS else "a drainer"
    return ValidationError({field: f"{value!r} is not {role}; choose one of: {names}."}, code="invalid")
