"""Hostile and malformed input to every form of the UI, with hypothesis: huge strings, NUL bytes,
unicode (digits that are not ASCII, right-to-left marks), negative and huge numbers, impossible
dates, SQL and template injection, fields missing or sent twice.

For each POST form (the role matrix's FORMS, posted by an operator, who may post them all) and the
login form: never a server error; either the input is accepted (something is written, and the page
the form leads to renders) or it is refused with a message saying why and nothing is written. For
each GET form (the filters of the event log, the Gantt chart, the pool and upgrades pages, the host
page's window, the advisor's run and the live fragments): never a server error, and a 400 names
the problem. Hostile markup never comes back unescaped.

Each example runs in a savepoint rolled back afterwards, so examples do not see each other."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opsplanner.roles import Role
from simulation import advisor_runs
from tests.test_security import FAST_HASHER, append_figures, database_state
from tests.test_security_ui import FORMS, World

pytestmark = pytest.mark.django_db

PROFILE = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
XSS = "<script>alert(1)</script>"
SPECIAL = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "'; DROP TABLE fleet_host; --",
    '" OR "1"="1',
    XSS,
    "{{ 7|add:7 }}",
    "{% debug %}",
    "%s%n%x",
    "../../etc/passwd",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "-1",
    "0",
    "-0",
    "9" * 30,
    "-" + "9" * 30,
    "1.5",
    "0x1f",
    "\u00b2",
    "\u0663",
    "\uff11\uff12",
    "2031-02-30T10:00",
    "0000-00-00T00:00",
    "9999-12-31T23:59",
    "0001-01-01T00:00",
    "2031-13-01T00:00",
    "10000-01-01T00:00",
    "2031-03-10T25:61",
    "\u202egnp.exe",
    "İstanbul",
    "🚀🚀🚀",
    "\ufeff",
    "null",
    "[]",
    "{}",
    "x" * 10_000,
    "é" * 3000,
]
HOSTILE = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(max_size=40),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats().map(repr),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)).map(
        lambda moment: moment.strftime("%Y-%m-%dT%H:%M")
    ),
)
# Tried in every field of every form, whatever the random examples are: the classics, explicitly.
MUST_TRY = ["\x00", "x" * 10_000, XSS, "'; DROP TABLE fleet_host; --", "\u00b2", "9" * 30, "9999-12-31T23:59", ""]
MISSING = object()
# An error message on a page: a field's or a form's error, a refusal notice, a filter's error list.
ERROR = re.compile(
    r'<(?:p|li)[^>]*class="(?:error|field-error|notice error|error refusal)[^"]*"[^>]*>\s*[^<\s]'
    r'|<ul class="errorlist[^"]*"><li>\s*[^<\s]'
)


def hostile_data(valid: dict[str, str], fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """The valid data with each field kept, replaced by something hostile, dropped or sent twice;
    at least one field is not the valid value."""
    choices = {
        name: st.one_of(st.just(valid.get(name, MISSING)), HOSTILE, st.just(MISSING), st.lists(HOSTILE, min_size=2))
        for name in fields
    }
    return (
        st.fixed_dictionaries(choices)
        .filter(lambda data: any(data[name] != valid.get(name, MISSING) for name in fields))
        .map(lambda data: {name: value for name, value in data.items() if value is not MISSING})
    )


def with_each_classic_in_each_field(check: Any, valid: dict[str, str], fields: list[str]) -> Any:
    """Add the MUST_TRY values as explicit examples: one field hostile, the others valid."""
    for name in fields:
        for value in MUST_TRY:
            check = example({**valid, name: value})(check)
    return check


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[World]:
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield World()
        transaction.set_rollback(True)


@pytest.fixture(autouse=True)
def no_advisor_runs_sent(monkeypatch) -> None:
    monkeypatch.setattr(advisor_runs, "_enqueue", lambda run_id: None)


@dataclass
class Tally:
    cases: int = 0
    accepted: int = 0
    refused: int = 0


def in_a_savepoint_rolled_back(check: Any) -> None:
    with transaction.atomic():
        check()
        transaction.set_rollback(True)


def assert_markup_escaped(data: dict[str, Any], response: Any) -> None:
    """Hostile markup never comes back as markup (a text/plain answer sent with nosniff is not HTML)."""
    if "text/html" in response.get("Content-Type", "") and any(XSS in str(value) for value in data.values()):
        assert XSS not in response.content.decode()


# --- POST forms -----------------------------------------------------------------------------------

LOGIN = "login"
POST_SURFACES = [*FORMS, LOGIN]
# Forms that answer an HTMX post with a notice in place (a plain post is redirected to a page that
# shows it): posted with HTMX, which is what the browser does, and cheaper than following.
NOTICE_FORMS = {"approve", "reject", "train pause", "train resume", "upgrade re-onboard"}


@pytest.mark.parametrize("name", POST_SURFACES)
def test_hostile_input_to_a_form_is_accepted_or_refused_with_a_message_and_never_a_server_error(
    world: World, name: str
) -> None:
    if name == LOGIN:
        path, valid, fields = "/login/", {}, ["username", "password"]
        client = Client()
    else:
        form = FORMS[name]
        path = form.path.format(w=world)
        valid = form.data(world) if callable(form.data) else dict(form.data)
        fields = list(valid)
        client = world.client(Role.OPERATOR)
    tally = Tally()
    htmx = name in NOTICE_FORMS

    def check(data: dict[str, Any]) -> None:
        def post() -> None:
            before = database_state()
            # A server error raises here (the test client re-raises the view's exception).
            response = client.post(path, data, follow=not htmx, headers={"HX-Request": "true"} if htmx else {})
            body = response.content.decode()
            assert response.status_code < 500
            assert_markup_escaped(data, response)
            if database_state() != before:
                assert response.status_code == 200, f"the page after an accepted {name} does not render"
                tally.accepted += 1
            else:
                assert ERROR.search(body), f"{name} refused {data!r} without saying why: {body[:2000]}"
                tally.refused += 1
            tally.cases += 1

        in_a_savepoint_rolled_back(post)

    PROFILE(given(hostile_data(valid, fields))(with_each_classic_in_each_field(check, valid, fields)))()
    assert tally.refused > 0
    append_figures(
        surface=f"form fuzz: {name}",
        cases=tally.cases,
        accepted=tally.accepted,
        refused_with_message=tally.refused,
        server_errors=0,
    )


# --- GET forms ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    path: str  # formatted with w=the world
    fields: tuple[str, ...]
    headers: tuple[tuple[str, str], ...] = ()


GET_FORMS = {
    "event log": Filter(
        "/events/", ("kind", "pool", "host", "operation", "train", "since", "until", "subject_type", "before")
    ),
    "gantt": Filter("/gantt/", ("start", "end", "pool", "train", "operation", "component", "expand")),
    "pool hosts": Filter("/fleet/pools/{w.pool.name}/", ("state", "page")),
    "host window": Filter("/fleet/hosts/{w.hosts[0].hostname}/", ("start", "end")),
    "upgrades": Filter("/trains/upgrades/", ("state",)),
    "advisor run": Filter("/simulations/advisor/", ("run",)),
    "advisor run poll": Filter("/simulations/advisor/", ("run",), (("HX-Request", "true"),)),
    "live fragments": Filter("/live/fragments/", ("page", "params")),
    "operations": Filter("/operations/", ("state", "kind", "source", "pool")),
    "operation tasks": Filter("/operations/{w.operation.pk}/", ("state", "page")),
    "scope preview": Filter("/operations/preview/", ("scope", "kind", "needs_drain"), (("HX-Request", "true"),)),
}


@pytest.mark.parametrize("name", list(GET_FORMS))
def test_hostile_filters_never_make_a_page_fail(world: World, name: str) -> None:
    surface = GET_FORMS[name]
    client, path = world.client(Role.OPERATOR), surface.path.format(w=world)
    tally = Tally()

    def check(query: dict[str, Any]) -> None:
        before = database_state()
        response = client.get(path, query, headers=dict(surface.headers))
        body = response.content.decode()
        assert response.status_code in (200, 400, 404), body[:500]
        if response.status_code == 400 and "text/html" in response["Content-Type"]:
            assert ERROR.search(body), f"a 400 without a message for {query!r}"
        assert_markup_escaped(query, response)
        assert database_state() == before
        tally.cases += 1
        tally.refused += response.status_code != 200

    fields = list(surface.fields)
    PROFILE(given(hostile_data({}, fields))(with_each_classic_in_each_field(check, {}, fields)))()
    append_figures(surface=f"filter fuzz: {name}", cases=tally.cases, refused=tally.refused, server_errors=0)


# --- what the fuzzing found -----------------------------------------------------------------------

NUL_REASON = {"reason": "kernel\x00fix"}
# (method, path, data, the status, words of the message): each was a server error before its fix.
FOUND = [
    ("post", "/trains/{w.train.pk}/pause/", NUL_REASON, 200, "Null characters are not allowed."),
    ("post", "/trains/{w.paused_train.pk}/resume/", NUL_REASON, 200, "Null characters are not allowed."),
    ("post", "/trains/upgrades/{w.offboarded.pk}/reonboard/", NUL_REASON, 200, "Null characters are not allowed."),
    ("post", "/approvals/{w.approval.pk}/decide/", {"decision": "reject", **NUL_REASON}, 200, "Null characters"),
    ("get", "/events/", {"before": "\u00b2"}, 400, "Before takes an event id"),
    ("get", "/simulations/advisor/", {"run": "\u00b2"}, 404, ""),
    ("get", "/gantt/", {"start": "9999-12-31T23:59"}, 400, "Give a time between 1970 and 9000."),
    ("get", "/gantt/", {"end": "0001-01-01T00:00"}, 400, "Give a time between 1970 and 9000."),
    ("get", "/fleet/hosts/{w.hosts[0].hostname}/", {"start": "9999-12-31T23:59"}, 200, "Give a time between"),
]


@pytest.mark.parametrize(("method", "path", "data", "status", "words"), FOUND, ids=[f"{m} {p}" for m, p, *_ in FOUND])
def test_input_that_once_made_a_server_error_is_refused_with_the_reason(
    world: World, method: str, path: str, data: dict[str, str], status: int, words: str
) -> None:
    before = database_state()
    headers = {"HX-Request": "true"} if method == "post" else {}  # the notice in place of a redirect
    response = getattr(world.client(Role.OPERATOR), method)(path.format(w=world), data, headers=headers)
    assert response.status_code == status
    assert words in response.content.decode()
    assert database_state() == before
