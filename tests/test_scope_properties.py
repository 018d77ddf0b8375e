"""Properties of the scope selector parser (opsplanner/scopes.py), with hypothesis:

- whatever text (or non-text) arrives, parsing and resolving it either work or raise the parser's
  ValidationError on "scope" with a message: never any other exception (a 500 in the API or UI);
- a selector written by an independent renderer, in any case and spacing, parses back to the
  selector it was written from, and resolves to exactly the hosts it names on a small fleet;
- "N% of pool P" takes ceil(N% of the pool) hosts, a prefix of the pool in domain order.

The examples are bounded and derandomized (the same ones every run), so the file runs in seconds."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.models import Host, InstalledVersion
from fleet.services import installed_version_set
from fleet.versions import version_sort_key
from opsplanner.scopes import MAX_SCOPE_LENGTH, Scope, parse_scope, resolve_scope
from tests.builders import _catalogue, make_fleet
from tests.test_security import append_figures

pytestmark = pytest.mark.django_db

PROFILE = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,  # no .hypothesis directory in the shared checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POOLS = ("ai-east", "web-west")


class Fleet:
    """ai-east: 3 racks of 4 hosts, the first 5 on gpu-driver 560.35.03 and the rest on 550.127.05;
    web-west: 1 rack of 3 hosts, one of them on 535.183.01."""

    def __init__(self) -> None:
        _, east = make_fleet(domains=3, hosts_per_domain=4, pool_name="ai-east")
        _, west = make_fleet(domains=1, hosts_per_domain=3, pool_name="web-west")
        driver = _catalogue()["gpu-driver"]
        for host in east[:5]:
            installed_version_set(host=host, version=driver["560.35.03"])
        installed_version_set(host=west[0], version=driver["535.183.01"])
        self.hosts = {host.hostname: host for host in [*east, *west]}
        self.driver = {
            row["host_id"]: row["version__version"]
            for row in InstalledVersion.objects.filter(component__name="gpu-driver").values(
                "host_id", "version__version"
            )
        }

    def pool_ids(self, pool: str) -> list[int]:
        return sorted(h.pk for h in self.hosts.values() if h.pool.name == pool)

    def domains(self, pool: str) -> list[str]:
        return sorted({h.domain.name for h in self.hosts.values() if h.pool.name == pool})


def resolved(text: Any) -> list[int] | ValidationError:
    """The host ids, or the parser's refusal. Any other exception escapes and fails the test
    (hypothesis then shrinks it to a small example)."""
    try:
        return resolve_scope(parse_scope(text))
    except ValidationError as error:
        return error


def assert_a_refusal_that_says_why(text: Any, error: ValidationError) -> None:
    messages = error.message_dict.get("scope") if hasattr(error, "error_dict") else None
    assert messages, f"{text!r}: a ValidationError without a scope message: {error!r}"
    assert all(message.strip() for message in messages)


# --- arbitrary and hostile text -------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,15}", fullmatch=True)
HOSTILE_WORDS = [
    "hosts",
    "host",
    ":",
    ",",
    "pool",
    "%",
    "of",
    "domain",
    "/",
    "running",
    "below",
    "in",
    "ai-east",
    "web-west",
    "rack-0001",
    "gpu-driver",
    "560.35.03",
    "0",
    "100",
    "100.0001",
    "-1",
    "1e3",
    "nan",
    "9" * 40,
    "\x00",
    "ß",
    "İ",
    "\u0660",
    "\u200b",
    "'",
    '"',
    ";",
    "--",
    "' OR 1=1 --",
    "DROP TABLE host;",
    "%%",
    "*",
    "..",
    "\\",
    "\n",
    "${x}",
    "{{x}}",
    "<script>",
]
SEPARATORS = st.sampled_from(["", " ", "  ", "\t", "\n", "\r\n", "\u00a0"])
NEAR_GRAMMAR = st.lists(
    st.tuples(st.one_of(st.sampled_from(HOSTILE_WORDS), NAMES, st.text(max_size=8)), SEPARATORS), max_size=12
).map(lambda parts: "".join(word + sep for word, sep in parts))
ANY_INPUT = st.one_of(
    st.text(max_size=80),
    NEAR_GRAMMAR,
    st.text(min_size=MAX_SCOPE_LENGTH - 5, max_size=MAX_SCOPE_LENGTH + 50),
    NAMES.map(lambda name: "hosts: " + ", ".join([name] * 60)),
    st.none(),
    st.integers(),
    st.binary(max_size=20),
    st.lists(st.text(max_size=5), max_size=3),
)


def test_no_input_makes_the_parser_or_the_resolver_raise_anything_but_its_validation_error() -> None:
    Fleet()
    cases = 0

    @PROFILE
    @given(ANY_INPUT)
    def check(text: Any) -> None:
        nonlocal cases
        cases += 1
        outcome = resolved(text)
        if isinstance(outcome, ValidationError):
            assert_a_refusal_that_says_why(text, outcome)

    check()
    append_figures(surface="scope parser: arbitrary input", cases=cases, server_errors=0)


# --- an independent renderer: write a selector, read it back --------------------------------------

SPACE = st.sampled_from([" ", "  ", "\t", " \t "])
CASE = st.sampled_from([str.lower, str.upper, str.title])
PERCENT = st.decimals(min_value=Decimal("0.001"), max_value=Decimal(100), places=3)
VERSIONS = st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,4}){0,3}(-rc[0-9])?", fullmatch=True)


@st.composite
def written_scopes(draw: st.DrawFn, fleet: Fleet) -> tuple[str, Scope]:
    """(the text, the Scope it means): words separated by any whitespace, in any case; the names
    are the fleet's (mostly) or made up."""
    sp, maybe_sp = draw(SPACE), draw(st.sampled_from(["", " "]))
    kind = draw(st.sampled_from(["hosts", "pool", "percent", "domain", "running"]))
    pool = draw(st.sampled_from(POOLS) | NAMES)
    if kind == "hosts":
        hostname = st.sampled_from(sorted(fleet.hosts)) | NAMES
        names = draw(st.lists(hostname, min_size=1, max_size=5, unique=True))
        text, scope = f"hosts{sp}:{sp}" + f",{sp}".join(names), Scope(kind="hosts", hostnames=tuple(names))
    elif kind == "pool":
        text, scope = f"pool{sp}{pool}", Scope(kind="pool", pool=pool)
    elif kind == "percent":
        percent = draw(PERCENT)
        text = f"{percent}{maybe_sp}%{sp}of{sp}pool{sp}{pool}"
        scope = Scope(kind="percent", pool=pool, percent=percent)
    elif kind == "domain":
        domain = draw(st.sampled_from(fleet.domains(POOLS[0])) | NAMES)
        text, scope = f"domain{sp}{pool}{maybe_sp}/{maybe_sp}{domain}", Scope(kind="domain", pool=pool, domain=domain)
    else:
        version, in_pool = draw(VERSIONS), draw(st.sampled_from(["", pool]))
        text = f"hosts{sp}running{sp}gpu-driver{sp}below{sp}{version}"
        if in_pool:
            text += f"{sp}in{sp}pool{sp}{in_pool}"
        scope = Scope(kind="running", component="gpu-driver", version=version, pool=in_pool)
    return draw(SPACE) + draw(CASE)(text) + draw(SPACE), scope


def expected_ids(fleet: Fleet, scope: Scope) -> list[int] | None:
    """The hosts the scope means, worked out in Python (None: it must be refused)."""
    if scope.kind == "hosts":
        found = [fleet.hosts[name].pk for name in scope.hostnames if name in fleet.hosts]
        return found if len(found) == len(scope.hostnames) else None
    if scope.pool and scope.pool not in POOLS:
        return None
    if scope.kind == "pool":
        return fleet.pool_ids(scope.pool)
    if scope.kind == "domain":
        hosts = [h.pk for h in fleet.hosts.values() if h.pool.name == scope.pool and h.domain.name == scope.domain]
        return sorted(hosts) or None
    if scope.kind == "running":
        below = version_sort_key(scope.version)
        ids = [
            host_id
            for host_id, version in fleet.driver.items()
            if version_sort_key(version) < below and (not scope.pool or host_id in fleet.pool_ids(scope.pool))
        ]
        return sorted(ids) or None
    return None  # percent: checked on its own below


def test_a_written_selector_parses_back_to_itself_and_resolves_to_exactly_its_hosts() -> None:
    fleet = Fleet()
    cases = resolving = 0

    @PROFILE
    @given(written_scopes(fleet))
    def check(written: tuple[str, Scope]) -> None:
        nonlocal cases
        cases += 1
        text, scope = written
        assert parse_scope(text) == scope
        if scope.kind == "percent":
            return
        expected, outcome = expected_ids(fleet, scope), resolved(text)
        if isinstance(outcome, ValidationError):
            assert expected is None, f"{text!r} was refused: {outcome.messages}"
            assert_a_refusal_that_says_why(text, outcome)
            return
        nonlocal resolving
        resolving += 1
        assert expected is not None, f"{text!r} resolved to {outcome} but should have been refused"
        assert (outcome if scope.kind == "hosts" else sorted(outcome)) == expected

    check()
    assert resolving >= cases // 5, "too few selectors named real hosts to prove the resolution"
    append_figures(surface="scope parser: round trip and resolution", cases=cases, resolved=resolving, server_errors=0)


def test_n_percent_of_a_pool_takes_the_rounded_up_share_in_domain_order() -> None:
    fleet = Fleet()
    everything = {pool: resolve_scope(parse_scope(f"100% of pool {pool}")) for pool in POOLS}
    positions = {h.pk: h.domain.position for h in Host.objects.select_related("domain")}
    cases = 0

    @PROFILE
    @given(PERCENT, st.sampled_from(POOLS))
    def check(percent: Decimal, pool: str) -> None:
        nonlocal cases
        cases += 1
        ids = resolve_scope(parse_scope(f"{percent}% of pool {pool}"))
        size = len(fleet.pool_ids(pool))
        assert len(ids) == math.ceil(size * percent / 100)
        assert 1 <= len(ids) <= size
        assert Decimal(len(ids) - 1) / size < percent / 100 <= Decimal(len(ids)) / size  # the fewest that reach N%
        assert ids == everything[pool][: len(ids)]  # a prefix: a bigger share only adds hosts
        assert [positions[i] for i in ids] == sorted(positions[i] for i in ids)  # domain by domain

    check()
    append_figures(surface="scope parser: percent bounds", cases=cases, server_errors=0)


@pytest.mark.parametrize("percent", ["0", "0.000", "100.001", "101", "99999999999999999999999"])
def test_a_percentage_outside_0_to_100_is_refused_with_the_bounds(percent: str) -> None:
    with pytest.raises(ValidationError, match="above 0 and at most 100"):
        parse_scope(f"{percent}% of pool ai-east")
