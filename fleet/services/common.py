"""Helpers shared by the inventory services."""

from __future__ import annotations

from typing import TypeVar

from django.db import models

M = TypeVar("M", bound=models.Model)


def validated_save(instance: M) -> M:
    """full_clean (field, model and constraint checks with readable messages), then save."""
    instance.full_clean()
    instance.save()
    return instance
