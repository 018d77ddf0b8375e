"""Hand-written representations for the big lists (hosts, events): DRF's per-field machinery costs
most of a 100-row page. The declared fields still define the schema, and a test checks that both
representations agree."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone


def iso(value: dt.datetime | None) -> str | None:
    """What DRF's DateTimeField renders: ISO 8601 in the current time zone, 'Z' for UTC."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
