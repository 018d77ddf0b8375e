"""Exploratory probes (print only)."""
from __future__ import annotations
import datetime as dt
import json
import pytest
from rest_framework.test import APIClient
from opsplanner import clock
from opsplanner.roles import Role
from opsplanner.models import Event
from tests.builders import make_fleet
from tests.trains_builders import make_train, make_user
from trains.models import Upgrade, Train

pytestmark = pytest.mark.django_db

def api():
    c = APIClient(raise_request_exception=False)
    c.force_authenticate(make_user(Role.OPERATOR))
    return c

BASE = {"component": "bios", "version": "2.16.0", "reason": "rollout"}

CASES = [
    ("deadline far", {"deadline": "9999-12-31T23:59:59Z"}),
    ("deadline 0001", {"deadline": "0001-01-01T00:00:00Z"}),
    ("deadline naive past", {"deadline": "2001-01-01T00:00"}),
    ("scope garbage", {"scope": "garbage !!"}),
    ("scope none", {"scope": "hosts running bios below 1.0"}),
    ("scope hosts unknown", {"scope": "hosts: nope1, nope2"}),
    ("unknown component", {"component": "nope"}),
    ("unknown version", {"version": "9.9"}),
    ("phases empty", {"phases": []}),
    ("phases str", {"phases": "abc"}),
    ("phase domain unknown", {"phases": [{"name": "c", "domain": "zz"}, {"name": "all", "percent": 100}]}),
    ("phase both", {"phases": [{"name": "c", "domain": "rack-0001", "percent": 5}, {"name": "all", "percent": 100}]}),
    ("phase percent 100 min 1000", {"phases": [{"name": "all", "percent": 100, "min_successes": 1000}]}),
    ("phase 50 then 100 min0 first", {"phases": [{"name": "a", "percent": 50, "min_successes": 0}, {"name": "all", "percent": 100}]}),
    ("phase 1%", {"phases": [{"name": "a", "percent": 1}, {"name": "all", "percent": 100, "min_successes": 0}]}),
    ("phase 1% any", {"phases": [{"name": "a", "percent": 1, "selection": "any"}, {"name": "all", "percent": 100, "min_successes": 0}]}),
    ("phase any domain", {"phases": [{"name": "a", "domain": "rack-0001", "min_successes": 6, "selection": "any"}, {"name": "all", "percent": 100, "min_successes": 0}]}),
    ("rate NaN", {"max_failure_rate": "NaN"}),
    ("rate 0.00004", {"max_failure_rate": 0.00004}),
    ("rate 0.99999", {"max_failure_rate": 0.99999}),
    ("multi no hpv", {"multi_cycle": True}),
    ("hpv no multi", {"hosts_per_visit": 3}),
    ("multi hpv", {"multi_cycle": True, "hosts_per_visit": 1}),
    ("priority 1001", {"priority": 1001}),
    ("duration huge", {"duration_s": 30 * 24 * 3600}),
    ("reason nul", {"reason": "a\x00b"}),
    ("component nul", {"component": "bi\x00os"}),
    ("scope nul", {"scope": "pool \x00"}),
    ("version withdrawn? 535", {"component": "gpu-driver", "version": "535.183.01"}),
    ("failure_rate_min_hosts 0", {"failure_rate_min_hosts": 0}),
    ("list body", None),
    ("phases 20 dom", {"phases": [{"name": f"p{i}", "domain": "rack-0001"} for i in range(3)] + [{"name": "all", "percent": 100}]}),
    ("phase name long", {"phases": [{"name": "x" * 63, "percent": 100, "min_successes": 0}]}),
    ("scope pct", {"scope": "150% of pool X"}),
    ("scope domain other", {"scope": "domain other/rack-0001"}),
]

@pytest.mark.parametrize("label,extra", CASES)
def test_probe_upgrade(label, extra):
    pool, _ = make_fleet(domains=2, hosts_per_domain=3)
    make_train(pool)
    c = api()
    before = (Upgrade.objects.count(), Event.objects.count())
    body = [1, 2] if extra is None else {"pool": pool.pk, **BASE, **extra}
    r = c.post("/api/upgrades/", body, format="json")
    after = (Upgrade.objects.count(), Event.objects.count())
    txt = r.content.decode()[:400]
    print(f"\nPROBE {label}: {r.status_code} {txt} rows {before}->{after}")
