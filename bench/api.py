"""API latency under load: the host list, the events list and executor claim/report, served by the
real ASGI server (daphne) over a fleet of 100,000 hosts, with 50 concurrent keep-alive clients.

Figures (per scenario, after a warm-up, for --seconds each, default 15):
- api_hosts_p50/_p95/_rps: GET /api/hosts/ as a viewer; each client walks the cursor pages (100
  hosts a page, following `next`) and starts again from the first page after PAGES_PER_WALK pages.
- api_events_p50/_p95/_rps: the same over GET /api/events/.
- api_hosts_paced_*, api_events_paced_*: the same 50 clients, each waiting 0.5-1.5 s between its
  requests (about 50 requests a second in all): the latency a client sees below saturation.
- api_claim_report_p50/_p95/_rps: an executor claims one ready drain item of its pool
  (POST /api/work-items/claim/) and reports it done (POST /api/work-items/{id}/report/ with an
  Idempotency-Key); latency and rate are of the pair, api_claim_p95 and api_report_p95 of each half.

Target: p95 under 50 ms for the lists at 50 concurrent clients.

Without the wait (the unpaced figures) clients are closed-loop: each sends its next request as soon as
the previous one is answered, so the server is saturated and the latency is about 50 / throughput.
Every non-2xx answer (and a claim that finds nothing) is an error and fails the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bench.common import Figure, WebServer, asgi_server_name, start_web_server

POOLS = 20
HOSTS_PER_POOL = 5_000
HOSTS_PER_DOMAIN = 50
# 20% of each pool admitted at once: 20,000 ready drain items, enough for minutes of claims.
PLANNED_FRACTION = "0.20"
HISTORY_EVENTS_PER_HOST = 5
CLIENTS = 50
# Daphne runs Django's sync views on one thread per process; two per core keep a request from
# waiting behind another in its process while the other core is idle.
SERVERS = int(os.environ.get("BENCH_API_SERVERS", "4"))
PAGES_PER_WALK = 20
DEFAULT_SECONDS = 15.0
WARM_UP_SECONDS = 3.0
THINK_SECONDS = (0.5, 1.5)  # the paced list scenarios: each client waits this long between requests


def run(seconds: float | None = None) -> list[Figure]:
    seconds = seconds or DEFAULT_SECONDS
    from bench.setup import django_on_scratch_database

    url = django_on_scratch_database("bench_api")
    pools, tokens = _seed()
    servers = _start_servers(url)
    try:
        results = asyncio.run(_all_scenarios(servers, tokens, pools, seconds))
    finally:
        _stop_servers(servers)
    _check_reports(results["claim_report"])

    how = (
        f"ASGI_SERVER={asgi_server_name()} python -m bench api --seconds {seconds:g} "
        f"({SERVERS} {asgi_server_name()} processes, DEBUG off, "
        "each with its psycopg connection pool, "
        f"{CLIENTS} keep-alive clients round-robin over them, 100,000 hosts in {POOLS} pools, "
        f"{HISTORY_EVENTS_PER_HOST * POOLS * HOSTS_PER_POOL:,}+ events"
    )
    figures: list[Figure] = []
    paced = f"each client waiting {THINK_SECONDS[0]:g}-{THINK_SECONDS[1]:g} s between requests"
    for name, what in (
        ("hosts", "GET /api/hosts/ as a viewer, walking cursor pages of 100, no wait between requests"),
        ("hosts_paced", f"GET /api/hosts/ as a viewer, walking cursor pages of 100, {paced}"),
        ("events", "GET /api/events/ as a viewer, walking cursor pages of 100, no wait between requests"),
        ("events_paced", f"GET /api/events/ as a viewer, walking cursor pages of 100, {paced}"),
        ("claim_report", "executor claims 1 drain item of its pool and reports it done, no wait; per pair"),
    ):
        result = results[name]
        detail = f"{how}); {what}"
        figures += [
            Figure(f"api_{name}_p50", round(result.percentile(50), 1), "ms", detail),
            Figure(f"api_{name}_p95", round(result.percentile(95), 1), "ms", detail),
            Figure(
                f"api_{name}_rps", round(result.rate(), 1), "req/s" if name != "claim_report" else "pairs/s", detail
            ),
        ]
    pair = results["claim_report"]
    detail = f"{how}); in the claim/report scenario"
    figures += [
        Figure("api_claim_p95", round(pair.percentile(95, "claim"), 1), "ms", detail + ", the claim alone"),
        Figure("api_report_p95", round(pair.percentile(95, "report"), 1), "ms", detail + ", the report alone"),
    ]
    return figures


# --- The fleet, its history and the work to claim ------------------------------------------------


def _seed() -> tuple[list[int], dict[str, str]]:
    """100,000 hosts in 20 pools, a history of events, ready external drain items in every pool, and
    a viewer's and an executor's API token. Returns the pool ids and the tokens by role."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from knox.models import AuthToken

    from bench.fleet import bench_fleet
    from opsplanner.models import Adapter, WorkItem, WorkKind, WorkState
    from opsplanner.roles import Role, roles_ensure
    from opsplanner.services.operations import operation_submit
    from opsplanner.services.tick import fleet_tick

    started = time.perf_counter()
    pools = bench_fleet(
        pools=POOLS, hosts_per_pool=HOSTS_PER_POOL, hosts_per_domain=HOSTS_PER_DOMAIN, planned_fraction=PLANNED_FRACTION
    )
    _seed_history()
    for pool in pools:
        operation_submit(
            kind="reboot",
            scope=f"pool {pool.name}",
            reason="api benchmark",
            executor=Adapter.EXTERNAL,
            drainer=Adapter.EXTERNAL,
        )
    fleet_tick(time_budget_s=300)
    ready = WorkItem.objects.filter(state=WorkState.READY, adapter=Adapter.EXTERNAL, kind=WorkKind.DRAIN).count()
    if ready < POOLS * 100:
        raise SystemExit(f"the tick made only {ready} external drain items ready")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # what autovacuum does on a live database after a bulk load
    groups = roles_ensure()
    tokens: dict[str, str] = {}
    for role in (Role.VIEWER, Role.EXECUTOR):
        user = get_user_model().objects.create_user(username=f"bench-{role}", password=uuid.uuid4().hex)
        user.groups.add(groups[role])
        tokens[role] = AuthToken.objects.create(user)[1]
    print(
        f"bench api: seeded {POOLS * HOSTS_PER_POOL:,} hosts and {ready:,} ready drain items "
        f"in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return [pool.pk for pool in pools], tokens


def _seed_history() -> None:
    """HISTORY_EVENTS_PER_HOST state-change events per host over the last 30 days, as the audit trail
    of a fleet in service for a while has (the events list reads the newest; filters probe all)."""
    from fleet.models import Host
    from opsplanner import clock
    from opsplanner.events import EventRow, events_copy_rows

    now = clock.now()
    states = ["in_service", "draining", "drained", "in_maintenance", "in_service"]
    hosts = list(Host.objects.values_list("id", "pool_id").order_by("id"))
    step = dt.timedelta(days=30) / (len(hosts) * HISTORY_EVENTS_PER_HOST)
    chunk: list[EventRow] = []
    n = 0
    for round_ in range(HISTORY_EVENTS_PER_HOST):
        for host_id, pool_id in hosts:
            n += 1
            before, after = states[round_ % len(states)], states[(round_ + 1) % len(states)]
            chunk.append(
                EventRow(
                    now - dt.timedelta(days=30) + step * n,
                    "host.state_changed",
                    None,
                    "scheduler",
                    "fleet.host",
                    host_id,
                    pool_id,
                    host_id,
                    "history for the api benchmark",
                    json.dumps({"from": before, "to": after}),
                )
            )
            if len(chunk) == 50_000:
                events_copy_rows(chunk)
                chunk = []
    events_copy_rows(chunk)


def _check_reports(result: Result) -> None:
    from opsplanner.models import WorkItem, WorkState

    reported = result.item_ids
    done = WorkItem.objects.filter(pk__in=reported, state=WorkState.DONE).count()
    if done != len(reported):
        raise SystemExit(f"{len(reported) - done} of {len(reported)} reported work items are not done")


# --- The servers ---------------------------------------------------------------------------------


def _start_servers(database_url: str) -> list[WebServer]:
    """SERVERS single-process servers, one port each (the benchmark spreads its clients over them)."""
    servers: list[WebServer] = []
    try:
        for i in range(SERVERS):
            servers.append(start_web_server(database_url, workers=1, name=f"api-{i + 1}"))
    except SystemExit:
        _stop_servers(servers)
        raise
    return servers


def _stop_servers(servers: list[WebServer]) -> None:
    for server in servers:
        if server.process.poll() is None:
            server.process.terminate()
    for server in servers:
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


# --- The load generator: asyncio, one keep-alive HTTP/1.1 connection per client ---------------------


class HttpError(Exception):
    pass


class Connection:
    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, headers: dict[str, str], body: object = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Accept: application/json"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        fields = {}
        for line in header_lines:
            if ":" in line:
                name, value = line.split(":", 1)
                fields[name.strip().lower()] = value.strip()
        if "content-length" in fields:
            data = await self.reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            data = await self._chunked()
        else:
            raise HttpError(f"{method} {path}: an answer with neither Content-Length nor chunks")
        if fields.get("connection", "").lower() == "close":
            await self.close()
        return status, data

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@dataclass
class Result:
    seconds: float = 0.0
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    item_ids: list[int] = field(default_factory=list)

    def add(self, what: str, ms: float) -> None:
        self.latencies_ms.setdefault(what, []).append(ms)

    def percentile(self, p: float, what: str = "total") -> float:
        values = sorted(self.latencies_ms[what])
        return values[min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))]  # nearest rank

    def rate(self) -> float:
        return len(self.latencies_ms["total"]) / self.seconds


Step = Callable[[Connection, "Client", Result | None], Awaitable[None]]


@dataclass
class Client:
    number: int
    pool_id: int
    token: str
    next_path: str | None = None
    pages: int = 0

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}"}


def _ok(status: int, data: bytes, what: str) -> object:
    if not 200 <= status < 300:
        raise HttpError(f"{what}: HTTP {status}: {data[:300]!r}")
    return json.loads(data)


def _list_step(first_page: str) -> Step:
    async def step(connection: Connection, client: Client, result: Result | None) -> None:
        path = client.next_path or first_page
        started = time.perf_counter()
        status, data = await connection.request("GET", path, client.auth)
        elapsed = (time.perf_counter() - started) * 1000
        page = _ok(status, data, f"GET {path}")
        assert isinstance(page, dict)
        if not page["results"]:
            raise HttpError(f"GET {path}: an empty page")
        client.pages += 1
        following = page.get("next")
        if following and client.pages < PAGES_PER_WALK:
            parts = urlsplit(following)
            client.next_path = f"{parts.path}?{parts.query}"
        else:
            client.next_path, client.pages = None, 0
        if result is not None:
            result.add("total", elapsed)

    return step


async def _claim_report_step(connection: Connection, client: Client, result: Result | None) -> None:
    body = {"kinds": ["drain"], "pool": client.pool_id, "limit": 1, "lease_seconds": 300, "worker": f"c{client.number}"}
    started = time.perf_counter()
    status, data = await connection.request("POST", "/api/work-items/claim/", client.auth, body)
    claimed = time.perf_counter()
    items = _ok(status, data, "POST /api/work-items/claim/")
    if not items:
        raise HttpError(f"the claim in pool {client.pool_id} found no ready drain item (too few seeded?)")
    assert isinstance(items, list)
    item = items[0]
    report = {"outcome": "done", "attempt": item["attempt"], "result": {}, "worker": f"c{client.number}"}
    headers = {**client.auth, "Idempotency-Key": uuid.uuid4().hex}
    path = f"/api/work-items/{item['id']}/report/"
    status, data = await connection.request("POST", path, headers, report)
    finished = time.perf_counter()
    answer = _ok(status, data, f"POST {path}")
    assert isinstance(answer, dict)
    if answer["state"] != "done":
        raise HttpError(f"POST {path}: the item is {answer['state']}, not done")
    if result is not None:
        result.add("claim", (claimed - started) * 1000)
        result.add("report", (finished - claimed) * 1000)
        result.add("total", (finished - started) * 1000)
        result.item_ids.append(item["id"])


async def _scenario(
    name: str, step: Step, clients: list[Client], ports: list[int], seconds: float, *, think: bool = False
) -> Result:
    """Every client runs `step` in a loop, WARM_UP_SECONDS unrecorded, then `seconds` recorded; with
    `think`, each waits a random THINK_SECONDS between its requests (an open, paced load)."""
    result = Result()
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + WARM_UP_SECONDS, start + WARM_UP_SECONDS + seconds

    async def client_loop(client: Client) -> None:
        connection = Connection(ports[client.number % len(ports)])
        try:
            while loop.time() < stop_at:
                recording = loop.time() >= measure_from
                try:
                    await step(connection, client, result if recording else None)
                    if think:
                        await asyncio.sleep(min(random.uniform(*THINK_SECONDS), max(0.0, stop_at - loop.time())))
                except (HttpError, OSError, asyncio.IncompleteReadError, KeyError, ValueError) as error:
                    result.errors.append(f"{type(error).__name__}: {error}")
                    await connection.close()
                    if len(result.errors) > 20:
                        return
        finally:
            await connection.close()

    await asyncio.gather(*(client_loop(client) for client in clients))
    result.seconds = seconds  # the requests recorded are those sent within these seconds
    if result.errors:
        raise SystemExit(f"{name}: {len(result.errors)} failed requests, e.g.\n" + "\n".join(result.errors[:5]))
    total = result.latencies_ms.get("total", [])
    print(
        f"bench api: {name}: {len(total):,} in {result.seconds:.1f} s, p50 {result.percentile(50):.1f} ms, "
        f"p95 {result.percentile(95):.1f} ms",
        file=sys.stderr,
        flush=True,
    )
    return result


async def _all_scenarios(
    servers: list[WebServer], tokens: dict[str, str], pools: list[int], seconds: float
) -> dict[str, Result]:
    from opsplanner.roles import Role

    ports = [server.port for server in servers]

    def clients(role: str) -> list[Client]:
        return [Client(i, pools[i % len(pools)], tokens[role]) for i in range(CLIENTS)]

    results: dict[str, Result] = {}
    for name, path in (("hosts", "/api/hosts/"), ("events", "/api/events/")):
        results[name] = await _scenario(name, _list_step(path), clients(Role.VIEWER), ports, seconds)
        results[f"{name}_paced"] = await _scenario(
            f"{name}_paced", _list_step(path), clients(Role.VIEWER), ports, seconds, think=True
        )
    results["claim_report"] = await _scenario(
        "claim_report", _claim_report_step, clients(Role.EXECUTOR), ports, seconds
    )
    return results
