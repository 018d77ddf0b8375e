"""Per-host agents over HTTP: AGENTS agents (one per host, simulated as asyncio clients in
AGENT_PROCESSES processes, one keep-alive connection each) work their own host's items with
realistic pauses: a long-polling claim of their host's items when they have none (and a pause
when it comes back empty), the work itself (WORK_SECONDS), then a report with claim_next, which
hands them the host's next ready item in the same round trip. Two real Celery workers and the
beat tick the pools; the ASGI server is ASGI_SERVER's (granian by default).

Figures:
- api_agent_step_p95_ms / _p50_ms: a step, from sending the report to the next item in hand, or
  to knowing there is none ready yet (the report's answer with `next`): what the API costs an agent.
- api_agent_claim_next_hit_pct: the share of reports that handed the next item at once (the
  others wait for the tick to create it: drain → execute → checks → undrain are tick steps).
- api_agent_wait_p95_ms: when the next item was not handed at once, report to next item in hand
  through the long poll (includes the orchestrator's tick, TICK_SECONDS=1).
- api_agent_reports_per_s: reports per second over all agents.

Target: api_agent_step_p95_ms under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, Figure, load_average, start_web_server, stop_process
from bench.host_ops import BusyDomains

AGENTS = 2_000
AGENT_PROCESSES = 2
POOLS = 4
HOSTS_PER_DOMAIN = 25
DEFAULT_SECONDS = 120.0
WARM_UP_SECONDS = 60.0
WEB_WORKERS = int(os.environ.get("BENCH_WEB_WORKERS", str(2 * (os.cpu_count() or 1))))
# Real drains, reboots and checks take minutes to tens of minutes; 20-60 s keep the steps many (about
# ten a second over the 400 hosts out at once) while an agent's request rate stays what a fleet of
# agents sends. An agent whose long poll came back empty polls again after a second or two, as
# opsplanner-agent does: the idle fleet is most of the requests (about 80 a second, each waiting
# up to LONG_POLL_S). (2-8 s of work with 10-30 s idle pauses, used before, asked about 200
# requests a second of 2 cores that also run the workers, the beat, PostgreSQL and the agents.)
WORK_SECONDS = (20.0, 60.0)  # an item's work on the host
IDLE_SECONDS = (1.0, 3.0)  # an agent whose long poll came back empty waits this long
LONG_POLL_S = 50  # as opsplanner-agent asks
BUSY_RETRY_S = 2.0  # the API's Retry-After on a 503 busy
LEASE_S = 300


def run(seconds: float | None = None) -> list[Figure]:
    seconds = seconds or DEFAULT_SECONDS
    from bench.host_ops import _start_workers_and_beat
    from bench.setup import django_on_scratch_database

    url = django_on_scratch_database("bench_api_agents")
    busy, token, hostnames = _seed()
    web = start_web_server(url, workers=WEB_WORKERS, name="api-agents")
    processes = _start_workers_and_beat(url)
    busy.keep_busy()  # the operations first: the agents' window starts when they start
    measure_from = time.time() + WARM_UP_SECONDS
    stop_at = measure_from + seconds
    share = -(-len(hostnames) // AGENT_PROCESSES)
    agents = [
        _start_agents(web.port, token, hostnames[i * share : (i + 1) * share], measure_from, stop_at)
        for i in range(AGENT_PROCESSES)
    ]
    loads = []
    try:
        while time.time() < stop_at:
            busy.keep_busy()
            loads.append(load_average())
            time.sleep(1)
        results = [_agent_results(process) for process in agents]
    finally:
        for process in [*agents, *processes, web.process]:
            stop_process(process, timeout=30)
    return _figures(results, seconds, web.server, loads[len(loads) // 2] if loads else load_average())


def _seed() -> tuple[BusyDomains, str, list[str]]:
    """AGENTS hosts in POOLS pools with external adapters, a token, and the host names."""
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken

    from bench.api_host_ops import external_busy_domains
    from bench.fleet import bench_fleet
    from fleet.models import Host, Pool
    from opsplanner.models import Adapter
    from opsplanner.roles import Role, roles_ensure

    pools = bench_fleet(
        pools=POOLS, hosts_per_pool=AGENTS // POOLS, hosts_per_domain=HOSTS_PER_DOMAIN, planned_fraction="0.20"
    )
    Pool.objects.filter(pk__in=[p.pk for p in pools]).update(drainer=Adapter.EXTERNAL, executor=Adapter.EXTERNAL)
    scopes = [f"domain {pool.name}/{name}" for pool in pools for name in pool.domains.values_list("name", flat=True)]
    user = get_user_model().objects.create_user(username="bench-agent", password=uuid.uuid4().hex)
    user.groups.add(roles_ensure()[Role.EXECUTOR])
    hostnames = list(Host.objects.order_by("id").values_list("hostname", flat=True))
    return external_busy_domains(scopes), AuthToken.objects.create(user)[1], hostnames


def _start_agents(
    port: int, token: str, hostnames: list[str], measure_from: float, stop_at: float
) -> subprocess.Popen[str]:
    logs = Path(os.environ.get("OPSPLANNER_VAR_DIR", ROOT / "var")) / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    hosts_file = logs / f"api-agents-{uuid.uuid4().hex[:8]}.json"
    hosts_file.write_text(json.dumps(hostnames))
    command = [
        sys.executable,
        "-m",
        "bench.api_agent_steps",
        str(port),
        str(hosts_file),
        str(measure_from),
        str(stop_at),
    ]
    with (logs / f"{hosts_file.stem}.log").open("w") as log:
        env = dict(os.environ, BENCH_AGENT_TOKEN=token)
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)


def _agent_results(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=LONG_POLL_S + 60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    if process.returncode != 0 or not out.strip():
        raise SystemExit(f"an agent process failed (exit {process.returncode}); see var/bench/api-agents-*.log")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))] if ordered else 0.0


def _figures(results: list[dict[str, Any]], seconds: float, server: str, load: str) -> list[Figure]:
    steps = [ms for r in results for ms in r["step_ms"]]
    waits = [ms for r in results for ms in r["wait_ms"]]
    hits = sum(r["hits"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    if errors:
        raise SystemExit(f"{len(errors)} failed requests, e.g.\n" + "\n".join(errors[:5]))
    if not steps:
        raise SystemExit("no agent reported anything: is the fleet busy?")
    spread = ", ".join(f"p{p} {_percentile(steps, p):.0f}" for p in (50, 75, 90, 95, 98, 99))
    print(f"bench api_agent_steps: step ms {spread}; {len(steps)} steps", file=sys.stderr, flush=True)
    how = (
        f"ASGI_SERVER={server} python -m bench api_agent_steps --seconds {seconds:g} ({AGENTS:,} agents, one per "
        f"host, asyncio clients in {AGENT_PROCESSES} processes, one keep-alive connection each; {WEB_WORKERS} "
        f"{server} processes, 2 worker processes + beat; work {WORK_SECONDS[0]:g}-{WORK_SECONDS[1]:g} s per item, "
        f"long polls of {LONG_POLL_S} s, idle pauses {IDLE_SECONDS[0]:g}-{IDLE_SECONDS[1]:g} s; {load})"
    )
    step = f"{how}; a step: report with claim_next to the next item in hand (or none ready yet)"
    return [
        Figure("api_agent_step_p50_ms", round(_percentile(steps, 50), 1), "ms", step),
        Figure("api_agent_step_p95_ms", round(_percentile(steps, 95), 1), "ms", step),
        Figure("api_agent_claim_next_hit_pct", round(100 * hits / len(steps), 1), "%", f"{how}; next item handed"),
        Figure("api_agent_wait_p95_ms", round(_percentile(waits, 95), 1), "ms", f"{how}; via the long poll"),
        Figure("api_agent_reports_per_s", round(len(steps) / seconds, 1), "reports/s", how),
        Figure("api_agent_busy_answers", sum(r["busy"] for r in results), "answers", f"{how}; 503 busy, retried"),
    ]


# --- The agents: asyncio, one keep-alive HTTP/1.1 connection each ---------------------------------


async def _agent(hostname: str, port: int, token: str, window: tuple[float, float], out: dict[str, Any]) -> None:
    """One host's agent: claim its items (long poll), work, report with claim_next, until the end."""
    from bench.api import Connection, HttpError

    measure_from, stop_at = window
    connection, auth = Connection(port), {"Authorization": f"Token {token}"}
    item: dict[str, Any] | None = None
    waiting_since: float | None = None
    await asyncio.sleep(random.uniform(0, LONG_POLL_S))  # agents started at different times
    try:
        while time.time() < stop_at:
            if item is None:
                claim = {"host": hostname, "limit": 1, "lease_seconds": LEASE_S, "wait_seconds": LONG_POLL_S}
                status, data = await _request(connection, "/api/work-items/claim/", auth, claim, out)
                items = _ok(status, data, "claim")
                if not items:
                    # Servers close idle keep-alive connections (uvicorn after 5 s): reconnect after the pause.
                    await connection.close()
                    await asyncio.sleep(random.uniform(*IDLE_SECONDS))
                    continue
                item = items[0]
                if waiting_since is not None and waiting_since >= measure_from:
                    out["wait_ms"].append((time.time() - waiting_since) * 1000)
                waiting_since = None
            await connection.close()  # the work outlasts the server's keep-alive: a new connection after it
            await asyncio.sleep(random.uniform(*WORK_SECONDS))
            item, waiting_since = await _report(connection, auth, item, measure_from, out)
    except (HttpError, OSError, asyncio.IncompleteReadError, ValueError, KeyError) as error:
        out["errors"].append(f"{hostname}: {type(error).__name__}: {error}")
    finally:
        await connection.close()


async def _report(
    connection: Any, auth: dict[str, str], item: dict[str, Any], measure_from: float, out: dict[str, Any]
) -> tuple[dict[str, Any] | None, float | None]:
    """Report the item done asking for the next; returns it (or None) and, when the host has a next
    step to wait for (not after its undrain, the last), when the wait began (wall clock)."""
    result: dict[str, Any] = {"passed": True} if item["kind"] == "verify" else {}
    body = {"outcome": "done", "attempt": item["attempt"], "result": result, "claim_next": True}
    headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
    started, wall = time.perf_counter(), time.time()
    status, data = await _request(connection, f"/api/work-items/{item['id']}/report/", headers, body, out)
    answer = _ok(status, data, "report")
    following = answer.get("next")
    if wall >= measure_from:
        out["step_ms"].append((time.perf_counter() - started) * 1000)
        out["hits"] += following is not None
    waits = following is None and item["kind"] != "undrain"
    return following, (wall if waits else None)


async def _request(
    connection: Any, path: str, headers: dict[str, str], body: dict[str, Any], out: dict[str, Any]
) -> tuple[int, bytes]:
    """POST, and on 503 busy wait the Retry-After and send it again, as opsplanner-agent does (the
    same Idempotency-Key, so a report the server did take is not taken twice); counted."""
    while True:
        status, data = await connection.request("POST", path, headers, body)
        if status != 503:
            return status, data
        out["busy"] += 1
        await asyncio.sleep(BUSY_RETRY_S)


def _ok(status: int, data: bytes, what: str) -> Any:
    from bench.api import HttpError

    if not 200 <= status < 300:
        raise HttpError(f"{what}: HTTP {status}: {data[:300]!r}")
    return json.loads(data)


async def _agents(port: int, hostnames: list[str], measure_from: float, stop_at: float) -> dict[str, Any]:
    out: dict[str, Any] = {"step_ms": [], "wait_ms": [], "hits": 0, "busy": 0, "errors": []}
    token = os.environ["BENCH_AGENT_TOKEN"]
    await asyncio.gather(*(_agent(name, port, token, (measure_from, stop_at), out) for name in hostnames))
    return out


def _agents_cli() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_agent_steps")
    parser.add_argument("port", type=int)
    parser.add_argument("hosts_file", type=Path)
    parser.add_argument("measure_from", type=float)
    parser.add_argument("stop_at", type=float)
    args = parser.parse_args()
    hostnames = json.loads(args.hosts_file.read_text())
    print(json.dumps(asyncio.run(_agents(args.port, hostnames, args.measure_from, args.stop_at))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_agents_cli())
