"""The advisor page: operators queue a run, either which domain size suits a pool of N hosts or a live
forecast (what-if on the live fleet: one live pool's next days under each policy); everyone who reads
the fleet sees the recent runs and their results. A queued or running run's region polls itself every
3 s (`?run=<id>` answers that run's partial) until it is done or failed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_http_methods

from console.htmx import render_page
from console.web import action_required, refuse
from opsplanner.models import AdvisorRun
from opsplanner.models.advisor import AdvisorRunKind
from opsplanner.permissions import Action, user_can
from simulation.advisor import advice_svg
from simulation.advisor_runs import (
    LIVE_FORECAST_POLICIES,
    MAX_FORECAST_DAYS,
    MAX_POOL_HOSTS,
    advisor_live_forecast_request,
    advisor_run_request,
)
from simulation.config import POLICIES

PAGE = "simulation/advisor.html"
RUN_PARTIAL = "simulation/htmx/advisor_run.html"
RECENT_RUNS = 10
LIVE_PREFIX = "live"


class ServiceErrorsForm(forms.Form):
    def add_service_error(self, error: ValidationError) -> None:
        """A service refusal next to the field it is about; anything else above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for key, errors in error.error_dict.items():
            self.add_error(key if key in self.fields else None, errors)


class AdvisorForm(ServiceErrorsForm):
    """The request's shape; the service checks the rest and its refusals land next to their field."""

    pool_hosts = forms.IntegerField(
        label="Pool hosts", min_value=1, max_value=MAX_POOL_HOSTS, initial=400, help_text="Hosts in the one pool."
    )
    sizes = forms.CharField(
        label="Domain sizes",
        max_length=200,
        initial="16, 40, 80",
        help_text="Hosts per domain to try, separated by commas (at most 12).",
    )
    interruption_cost = forms.FloatField(
        label="Interruption cost", min_value=0, initial=100, help_text="What interrupting one job once costs."
    )
    capacity_hour_cost = forms.FloatField(
        label="Capacity-hour cost",
        min_value=0,
        initial=1,
        help_text="What a host doing no work for an hour costs: a buffer host held back, or one an interrupted "
        "job strands.",
    )
    cycle_slo_hours = forms.FloatField(
        label="Cycle SLO (hours)", min_value=0.1, initial=72, help_text="A cycle over the whole pool ends within."
    )

    def clean_sizes(self) -> list[int]:
        parts = [part.strip() for part in self.cleaned_data["sizes"].split(",") if part.strip()]
        try:
            sizes = [int(part) for part in parts]
        except ValueError:
            raise ValidationError(
                "Give the sizes as whole numbers separated by commas, e.g. 16, 40, 80.", code="invalid"
            ) from None
        if not sizes:
            raise ValidationError("Give at least one domain size.", code="required")
        return sizes


class LiveForecastForm(ServiceErrorsForm):
    """What-if on the live fleet: which live pool, how many days, which policies (the service checks the pool)."""

    pool = forms.CharField(label="Live pool", max_length=200, help_text="The name of the live pool to forecast.")
    days = forms.IntegerField(
        label="Days", min_value=1, max_value=MAX_FORECAST_DAYS, initial=7, help_text="How far ahead to forecast."
    )
    policies = forms.MultipleChoiceField(
        label="Policies",
        choices=[(policy, policy) for policy in POLICIES],
        initial=list(LIVE_FORECAST_POLICIES),
        widget=forms.CheckboxSelectMultiple,
        help_text="Each is forecast from the same live state.",
    )


@dataclass
class RunView:
    run: AdvisorRun
    poll_url: str
    open: bool
    points: list[dict[str, Any]] = field(default_factory=list)
    svg: SafeString | None = None
    summary: str = ""
    forecast: list[dict[str, Any]] = field(default_factory=list)  # a live forecast's rows, one per policy
    upgrades: list[dict[str, Any]] = field(default_factory=list)  # and per policy and pending upgrade
    forecast_start: dt.datetime | None = None


def _number(value: float) -> str:
    return f"{value:g}"


def _live_summary(params: dict[str, Any]) -> str:
    days = params.get("days")
    return (
        f"live forecast · pool {params.get('pool')} · {days} day{'' if days == 1 else 's'} · "
        f"{', '.join(params.get('policies', []))}"
    )


def run_view(run: AdvisorRun, *, open_: bool) -> RunView:
    params = run.params or {}
    poll_url = f"{reverse('advisor')}?run={run.pk}"
    if run.kind == AdvisorRunKind.LIVE_FORECAST:
        view = RunView(run=run, poll_url=poll_url, open=open_, summary=_live_summary(params))
        result = run.result or {}
        view.forecast = list(result.get("policies", []))
        view.upgrades = [{"policy": row["policy"], **up} for row in view.forecast for up in row.get("upgrades", [])]
        if result.get("start_at"):
            view.forecast_start = dt.datetime.fromisoformat(result["start_at"])
        return view
    summary = (
        f"{params.get('pool_hosts')} hosts · sizes {', '.join(map(str, params.get('sizes', [])))} · "
        f"cycle SLO {_number(params.get('cycle_slo_hours', 0))} h · interruption "
        f"{_number(params.get('interruption_cost', 0))} · host-hour {_number(params.get('capacity_hour_cost', 0))}"
    )
    view = RunView(run=run, poll_url=poll_url, open=open_, summary=summary)
    result = run.result
    if result:
        view.points = list(result.get("points", []))
        if any(point.get("cost") is not None for point in view.points):
            view.svg = mark_safe(advice_svg(result))  # our plotting code's SVG, text escaped
    return view


def _context(
    request: HttpRequest, form: AdvisorForm | None, selected: int | None, live_form: LiveForecastForm | None = None
) -> dict[str, Any]:
    runs = list(AdvisorRun.objects.order_by("-created_at", "-id")[:RECENT_RUNS])
    if selected is None and runs:
        selected = runs[0].pk
    views = [run_view(run, open_=run.pk == selected) for run in runs]
    if selected is not None and all(view.run.pk != selected for view in views):
        older = AdvisorRun.objects.filter(pk=selected).first()
        if older is not None:
            views.append(run_view(older, open_=True))
    can_operate = user_can(request.user, Action.OPERATE)
    if can_operate and form is None:
        form = AdvisorForm()
    if can_operate and live_form is None:
        live_form = LiveForecastForm(prefix=LIVE_PREFIX)
    return {"form": form if can_operate else None, "live_form": live_form if can_operate else None, "runs": views}


def _selected(request: HttpRequest) -> int | None:
    raw = request.GET.get("run", "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone admits "²", which int() refuses
        raise Http404("No such advisor run.")
    return int(raw)


@action_required(Action.READ)
@require_http_methods(["GET", "POST"])
def advisor_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _advisor_submit(request)
    selected = _selected(request)
    htmx = getattr(request, "htmx", None)
    if selected is not None and htmx and not htmx.boosted:  # a run's region polling itself: that run alone
        run = AdvisorRun.objects.filter(pk=selected).first()
        if run is None:
            raise Http404("No such advisor run.")
        context = {"view": run_view(run, open_=True)}
        return render_page(request, PAGE, RUN_PARTIAL, context)
    return render(request, PAGE, _context(request, None, selected))


def _status(form: forms.Form) -> int:
    return 409 if any(error.code == "conflict" for error in form.non_field_errors().as_data()) else 400


def _advisor_submit(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, Action.OPERATE):
        return refuse(request, "Your role does not allow you to run the advisor.")
    if request.POST.get("kind") == AdvisorRunKind.LIVE_FORECAST:
        return _live_submit(request)
    form = AdvisorForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = advisor_run_request(
                pool_hosts=data["pool_hosts"],
                sizes=data["sizes"],
                interruption_cost=data["interruption_cost"],
                capacity_hour_cost=data["capacity_hour_cost"],
                cycle_slo_hours=data["cycle_slo_hours"],
                actor=request.user,
            )
        except ValidationError as error:  # nothing was written; say why next to the field
            form.add_service_error(error)
        else:
            return redirect(f"{reverse('advisor')}?run={run.pk}")
    return render(request, PAGE, _context(request, form, None), status=_status(form))


def _live_submit(request: HttpRequest) -> HttpResponse:
    form = LiveForecastForm(request.POST, prefix=LIVE_PREFIX)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = advisor_live_forecast_request(
                pool=data["pool"], days=data["days"], policies=data["policies"], actor=request.user
            )
        except ValidationError as error:  # nothing was written; say why next to the field
            form.add_service_error(error)
        else:
            return redirect(f"{reverse('advisor')}?run={run.pk}")
    return render(request, PAGE, _context(request, None, None, form), status=_status(form))
