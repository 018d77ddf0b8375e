"""What a Gantt shows: the time window, the filters, which domains are expanded. A form, so bad
input on the page gets a clear message; the same values travel to the live socket as params."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django import forms
from django.db.models import Max
from django.utils import timezone

from opsplanner import clock

# The page opens on what is happening now, at the scale of the live trains' visits: about
# VISITS_ACROSS visits wide (a quarter of it past), within [MIN_SPAN, MAX_DEFAULT_SPAN]; with no live
# train, the last hour and the next three.
DEFAULT_BEFORE = dt.timedelta(hours=1)
DEFAULT_AFTER = dt.timedelta(hours=3)
VISITS_ACROSS = 40
MIN_SPAN = dt.timedelta(hours=1)
MAX_DEFAULT_SPAN = dt.timedelta(days=7)
MAX_SPAN = dt.timedelta(days=31)
MAX_EXPANDED = 20
# Times outside these are refused: the window's defaults and the zoom and pan links add and subtract
# weeks, which must not run off the calendar (year 1 or 9999: OverflowError, a server error).
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class GanttParams:
    start: dt.datetime
    end: dt.datetime
    pool: str = ""
    train: int | None = None
    operation: int | None = None
    component: str = ""
    expand: frozenset[int] = field(default_factory=frozenset)
    host: int | None = None  # the host page's single row

    @property
    def span(self) -> dt.timedelta:
        return self.end - self.start

    def query(self, **changes: object) -> dict[str, str]:
        """These params as query-string values (for links that zoom, pan or expand)."""
        values: dict[str, object] = {
            "start": self.start,
            "end": self.end,
            "pool": self.pool,
            "train": self.train,
            "operation": self.operation,
            "component": self.component,
            "expand": self.expand,
        }
        values.update(changes)
        out: dict[str, str] = {}
        for key, value in values.items():
            if value in (None, "", frozenset(), set()):
                continue
            if isinstance(value, dt.datetime):
                out[key] = value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M")
            elif isinstance(value, (set, frozenset)):
                out[key] = ",".join(str(v) for v in sorted(value))
            else:
                out[key] = str(value)
        return out


class GanttForm(forms.Form):
    start = forms.DateTimeField(required=False, help_text="UTC")
    end = forms.DateTimeField(required=False, help_text="UTC")
    pool = forms.SlugField(required=False, max_length=63)
    train = forms.IntegerField(required=False, min_value=1)
    operation = forms.IntegerField(required=False, min_value=1)
    component = forms.CharField(required=False, max_length=63)
    expand = forms.CharField(required=False, max_length=400)

    def clean_expand(self) -> frozenset[int]:
        raw = self.cleaned_data.get("expand") or ""
        try:
            ids = frozenset(int(part) for part in raw.split(",") if part.strip())
        except ValueError:
            raise forms.ValidationError("Expand takes domain ids separated by commas, e.g. 3,7.") from None
        if len(ids) > MAX_EXPANDED:
            raise forms.ValidationError(f"Expand at most {MAX_EXPANDED} domains at once.")
        return ids

    def _utc(self, value: dt.datetime | None) -> dt.datetime | None:
        if value is None:
            return None
        # datetime-local inputs carry no zone: the page says they are UTC.
        return value.replace(tzinfo=dt.UTC) if timezone.is_naive(value) else value.astimezone(dt.UTC)

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        now = clock.now()
        start, end = self._utc(data.get("start")), self._utc(data.get("end"))
        for name, value in (("start", start), ("end", end)):
            if value is not None and not EARLIEST <= value <= LATEST:
                self.add_error(name, f"Give a time between {EARLIEST:%Y} and {LATEST:%Y}.")
                return data
        if start is None and end is not None:
            start = end - (DEFAULT_BEFORE + DEFAULT_AFTER)
        elif end is None and start is not None:
            end = start + DEFAULT_BEFORE + DEFAULT_AFTER
        elif start is None or end is None:  # neither given
            start, end = default_window(now)
        if end <= start:
            self.add_error("end", "The end of the time range must be after its start.")
        elif end - start < MIN_SPAN:
            self.add_error("end", "Show at least one hour.")
        elif end - start > MAX_SPAN:
            self.add_error("end", f"Show at most {MAX_SPAN.days} days at once; zoom in or pan instead.")
        data["start"], data["end"] = start, end
        return data

    def params(self, *, host: int | None = None) -> GanttParams:
        data = self.cleaned_data
        return GanttParams(
            start=data["start"],
            end=data["end"],
            pool=data.get("pool") or "",
            train=data.get("train"),
            operation=data.get("operation"),
            component=(data.get("component") or "").strip(),
            expand=data.get("expand") or frozenset(),
            host=host,
        )


def default_window(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """Now, at the scale of the live trains' visits (one query): a visit is a bar, not a sliver."""
    from trains.models import LIVE_TRAIN_STATES, Train

    longest = Train.objects.filter(state__in=LIVE_TRAIN_STATES).aggregate(value=Max("visit_estimate_s"))["value"]
    if longest is None:
        return now - DEFAULT_BEFORE, now + DEFAULT_AFTER
    span = min(max(dt.timedelta(seconds=longest * VISITS_ACROSS), MIN_SPAN), MAX_DEFAULT_SPAN)
    return now - span / 4, now + span * 3 / 4


def gantt_params(values: dict[str, str], *, host: int | None = None) -> tuple[GanttParams | None, GanttForm]:
    """Validated params (None when invalid: the form holds the messages)."""
    form = GanttForm(values)
    if not form.is_valid():
        return None, form
    return form.params(host=host), form
