"""What every page view shares: the permission gate (the one `user_can`) and the refusal page."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.validators import ProhibitNullCharactersValidator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from opsplanner.permissions import Action, user_can

ACTION_WORDS = {
    Action.READ: "see the fleet",
    Action.OPERATE: "run operations, trains and upgrades",
    Action.APPROVE: "decide approvals",
    Action.MANAGE_OWN_SERVICE: "manage services' opt-out windows and reservations",
    Action.EXECUTE: "execute work items",
}


def no_null_characters(value: str) -> None:
    """Text posted without a form (a decision's reason): refuse NUL characters with a
    ValidationError, as a form's CharField does; PostgreSQL cannot store them."""
    ProhibitNullCharactersValidator()(value)


def refuse(request: HttpRequest, message: str, *, status: int = 403) -> HttpResponse:
    """A refusal page that says why (403 by default)."""
    return render(request, "opsplanner/refused.html", {"message": message}, status=status)


def action_required(action: Action) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Log in first, then the user's role must allow `action`; otherwise a 403 page that says why."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not user_can(request.user, action):
                if not user_can(request.user, Action.READ):
                    return render(request, "opsplanner/no_pages.html", status=403)
                return refuse(request, f"Your role does not allow you to {ACTION_WORDS[action]}.")
            return view(request, *args, **kwargs)

        return guarded

    return decorate
