"""The HTTP client every adapter uses to talk to OpsPlanner's work-item API (standard library only).

    client = ApiClient("https://opsplanner.example", token, worker="agent@host-1", timeout_s=30)
    items = client.claim(adapter="agent", kinds=["execute", "verify"], host="host-1", wait_seconds=10)
    for item in items:                       # dicts as the API answers them: id, kind, attempt, params, ...
        still_ours = client.heartbeat(item)  # False: the item is no longer ours (409/404), stop it
        client.report(item, ok=True, reason="", result={"versions": {...}}, report_key="...")

Errors: `ApiError(status, body)` for an answer the server meant (4xx: bad input, not ours, ...);
`ApiUnreachable` when there is no answer to act on (connection refused, timeout, 5xx). An adapter's
loop waits with a `Backoff` after `ApiUnreachable` and resets it after a success:

    backoff = Backoff(base_s=1, cap_s=60)
    while True:
        try:
            items = client.claim(...)
            backoff.reset()
        except ApiUnreachable:
            time.sleep(backoff.next_delay())

The worker name is sent with every call: the server knows the claimer as "<user>/<worker>", so two
processes with the same token and different worker names never heartbeat or report each other's items.
A report's `report_key` is its idempotency key: sending the same report again is harmless.

The agent and the SSH executor keep an item's lease with a `Heartbeat` thread while its steps run,
and report it with `report_until_answered` (the same key on every retry)."""

from __future__ import annotations

import json
import logging
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

CLAIM_PATH = "/api/work-items/claim/"
USER_AGENT = "opsplanner-adapters/0.1"
# Reasons are stored up to 500 characters by the API.
MAX_REASON = 500
log = logging.getLogger("opsplanner_adapters.client")


class ApiError(Exception):
    """The API answered with a refusal (4xx): `status` and the decoded `body` say why."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {_short(body)}")


class ApiUnreachable(Exception):
    """No usable answer: the server could not be reached, timed out or failed (5xx). Retry later."""


def _short(body: Any, limit: int = 300) -> str:
    text = body if isinstance(body, str) else json.dumps(body, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Backoff:
    """Exponential back-off with jitter, capped: base, 2·base, 4·base ... up to cap, each delay
    spread by ±jitter (a fraction) so that many adapters do not retry in step; `reset` after a success."""

    def __init__(
        self, *, base_s: float = 1.0, cap_s: float = 60.0, jitter: float = 0.25, rng: random.Random | None = None
    ) -> None:
        if base_s <= 0 or cap_s < base_s or not 0 <= jitter < 1:
            raise ValueError("Backoff needs 0 < base_s <= cap_s and 0 <= jitter < 1")
        self.base_s, self.cap_s, self.jitter = base_s, cap_s, jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """The delay before the next try (and count this failure)."""
        raw = min(self.cap_s, self.base_s * 2 ** min(self.failures, 32))
        self.failures += 1
        spread = raw * self.jitter
        return min(self.cap_s, max(0.0, raw + self._rng.uniform(-spread, spread)))

    def reset(self) -> None:
        self.failures = 0


class ApiClient:
    """One adapter process's connection to the API: a base URL, a knox token and a worker name."""

    def __init__(self, base_url: str, token: str, worker: str, timeout_s: float = 30.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the API URL must start with http:// or https://, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.worker = worker
        self.timeout_s = timeout_s

    # -- the calls ----------------------------------------------------------------------------------
    def claim(
        self,
        *,
        adapter: str,
        kinds: Iterable[str],
        host: str | None = None,
        pool: int | None = None,
        limit: int = 1,
        lease_seconds: int = 300,
        wait_seconds: int = 0,
    ) -> list[dict[str, Any]]:
        """Claim up to `limit` ready items of this adapter (and kinds, host, pool); with
        `wait_seconds` the server holds the request until one is ready (a long poll)."""
        body: dict[str, Any] = {
            "adapter": adapter,
            "kinds": list(kinds),
            "limit": limit,
            "lease_seconds": lease_seconds,
            "wait_seconds": wait_seconds,
            "worker": self.worker,
        }
        if host:
            body["host"] = host
        if pool is not None:
            body["pool"] = pool
        return self.post(CLAIM_PATH, body, timeout_s=self.timeout_s + wait_seconds)

    def heartbeat(self, item: Mapping[str, Any], *, lease_seconds: int = 300) -> bool:
        """Extend the item's lease; False when it is no longer ours (taken back, finished, gone)."""
        body = {"attempt": item["attempt"], "lease_seconds": lease_seconds, "worker": self.worker}
        try:
            self.post(f"/api/work-items/{item['id']}/heartbeat/", body)
        except ApiError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def report(
        self, item: Mapping[str, Any], *, ok: bool, reason: str, result: Mapping[str, Any], report_key: str
    ) -> dict[str, Any]:
        """Report the item done (`ok`) or failed with its result; the same `report_key` again is a
        harmless retry that returns the first answer."""
        body = {
            "outcome": "done" if ok else "failed",
            "attempt": item["attempt"],
            "result": dict(result),
            "reason": reason[:MAX_REASON],
            "worker": self.worker,
        }
        return self.post(f"/api/work-items/{item['id']}/report/", body, headers={"Idempotency-Key": report_key})

    def report_until_answered(
        self,
        item: Mapping[str, Any],
        *,
        ok: bool,
        reason: str,
        result: Mapping[str, Any],
        backoff: Backoff,
        stopping: threading.Event,
    ) -> bool:
        """Report, again with the same key while the API is unreachable: True once accepted; False
        when refused (logged) or when stopping with the API unreachable (the caller's state keeps
        the outcome for the next start)."""
        key = f"{self.worker}:{item['id']}:{item['attempt']}"[:128]
        while True:
            try:
                self.report(item, ok=ok, reason=reason, result=result, report_key=key)
            except ApiUnreachable as error:
                if stopping.is_set():
                    return False
                delay = backoff.next_delay()
                log.warning("cannot report item %s yet (%s); again in %.1fs", item["id"], error, delay)
                stopping.wait(delay)
                continue
            except ApiError as error:
                log.error("the report of item %s was refused: %s", item["id"], error)
                return False
            backoff.reset()
            log.info("item %s reported %s %s", item["id"], "done" if ok else "failed", reason)
            return True

    def item(self, item_id: int) -> dict[str, Any]:
        """One item as the API shows it now (state, claimed_by, attempt ...)."""
        return self.request("GET", f"/api/work-items/{item_id}/")

    # -- plumbing -------------------------------------------------------------------------------------
    def post(
        self, path: str, body: Any, *, headers: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> Any:
        return self.request("POST", path, body, headers=headers, timeout_s=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One call; the decoded JSON answer. Raises ApiError (4xx) or ApiUnreachable (no answer, 5xx)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Token {self.token}")
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                return _decode(answer.read())
        except urllib.error.HTTPError as error:
            payload = _decode(error.read())
            if error.code >= 500:
                raise ApiUnreachable(f"{method} {path}: the server failed (HTTP {error.code})") from None
            raise ApiError(error.code, payload) from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            # URLError wraps refused connections and DNS failures; OSError covers timeouts and resets.
            reason = getattr(error, "reason", error)
            raise ApiUnreachable(f"{method} {self.base_url}{path}: {reason}") from None


class Heartbeat:
    """Keeps one item's lease alive from a thread while the item runs, every `every_s` (by default a
    third of the lease); `lost` once the API says the item is no longer ours (its report is then
    skipped: someone else has it now). A failed heartbeat is logged: the lease has room for misses.

        with Heartbeat(client, item, lease_seconds=300) as beat:
            outcome = run(item)
        if not beat.lost:
            client.report(item, ...)"""

    def __init__(
        self, client: ApiClient, item: Mapping[str, Any], *, lease_seconds: int, every_s: float | None = None
    ) -> None:
        self.client, self.item, self.lease_seconds = client, item, lease_seconds
        self.every_s = every_s if every_s is not None else max(1.0, lease_seconds / 3)
        self._lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{item['id']}", daemon=True)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.client.timeout_s + 1)  # at most one request in flight

    def _beat(self) -> None:
        while not self._done.wait(self.every_s):
            try:
                if not self.client.heartbeat(self.item, lease_seconds=self.lease_seconds):
                    log.warning("item %s is no longer ours; its outcome will not be reported", self.item["id"])
                    self._lost.set()
                    return
            except (ApiUnreachable, ApiError) as error:
                log.warning("heartbeat of item %s failed: %s", self.item["id"], error)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")
