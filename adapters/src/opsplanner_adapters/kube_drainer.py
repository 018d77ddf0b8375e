"""opsplanner-kube-drainer: drains and returns hosts that are Kubernetes nodes, for OpsPlanner.

    opsplanner-kube-drainer --config /etc/opsplanner/kube-drainer.toml

It claims the drain and undrain items of adapter "kubernetes" through the API and works on each in
its own thread (a drain may wait long for a PodDisruptionBudget; nothing else waits on it):

- drain: cordon the node with our annotation, evict its pods through the eviction API, heartbeat
  while waiting, report done when they are gone; shortly before the item's deadline report failed
  naming the pods that block (and which budget). See `opsplanner_adapters.kubernetes`.
- undrain: uncordon a node only if our annotation is on it. A node cordoned by someone else stays
  cordoned and the undrain fails naming that, so the host is not counted in service while
  Kubernetes keeps it out (the same rule as the Slurm drainer).
- when the API is unreachable the loop backs off (doubling, capped); reports are retried with the
  same idempotency key. On SIGTERM, drains in progress stop where they are and keep their leases:
  a restarted drainer gets the items back after the lease and finds the node as it was left."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import signal
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff

try:
    import httpx2
    import yaml
    from lightkube import Client, KubeConfig, SingleConfig
    from lightkube import ConfigError as KubeConfigError

    from opsplanner_adapters.kubernetes import DrainSettings, KubeDrainer, Outcome
except ModuleNotFoundError as missing:  # the `kubernetes` extra: one line, not a traceback
    sys.exit(f"opsplanner-kube-drainer: {missing.name} is not installed: pip install 'opsplanner-adapters[kubernetes]'")

ADAPTER = "kubernetes"
KINDS = ("drain", "undrain")
DEFAULT_DRAIN_S = 3600.0  # an item without a deadline (the API always gives one)
log = logging.getLogger("opsplanner.kube_drainer")


class ConfigError(Exception):
    """The configuration cannot be used; the message is one line naming the key."""


@dataclass(frozen=True)
class KubeDrainerConfig:
    api_url: str
    token: str
    worker: str
    kubeconfig: str | None = None  # None: the pod's service account (in-cluster)
    context: str | None = None
    drain: DrainSettings = field(default_factory=DrainSettings)
    poll_interval_s: float = 5.0
    lease_s: int = 120
    deadline_margin_s: float = 15.0
    max_items: int = 20
    timeout_s: float = 30.0
    backoff_cap_s: float = 60.0
    node_pattern: str = "{hostname}"
    node_map: dict[str, str] = field(default_factory=dict)

    def node_name(self, hostname: str) -> str:
        """The host's Kubernetes node: the mapping, else the pattern over its name."""
        if hostname in self.node_map:
            return self.node_map[hostname]
        return self.node_pattern.format(hostname=hostname, short=hostname.split(".", 1)[0])


_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a DNS subdomain, as nodes are named


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def _number(table: dict[str, Any], key: str, default: float, *, section: str, minimum: float = 0.1) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{section}.{key} must be a number of at least {minimum}, not {value!r}")
    return float(value)


def _token(api: dict[str, Any], base: Path) -> str:
    token: object  # the file's text, or whatever the config holds (checked below)
    if "token_file" in api:
        path = base / str(api["token_file"])
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise ConfigError(f"api.token_file {path}: {error.strerror}") from None
    else:
        token = api.get("token")
    if not isinstance(token, str) or not token:
        raise ConfigError("api.token (or api.token_file) is required: an executor token from `manage.py token_create`")
    return token


def _nodes(nodes: dict[str, Any]) -> tuple[str, dict[str, str]]:
    pattern = str(nodes.get("pattern", "{hostname}"))
    try:
        sample = pattern.format(hostname="h.example", short="h")
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"nodes.pattern {pattern!r} may only use {{hostname}} and {{short}}") from None
    if not _NODE_NAME.match(sample):
        raise ConfigError(f"nodes.pattern {pattern!r} does not give a node name")
    mapping = nodes.get("map", {})
    if not isinstance(mapping, dict) or not all(isinstance(v, str) and _NODE_NAME.match(v) for v in mapping.values()):
        raise ConfigError("nodes.map must map host names to Kubernetes node names (lower-case DNS names)")
    return pattern, dict(mapping)


def _drain_settings(kube: dict[str, Any]) -> DrainSettings:
    force = kube.get("force", False)
    if not isinstance(force, bool):
        raise ConfigError(f"kubernetes.force must be true or false, not {force!r}")
    grace = kube.get("grace_seconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
        raise ConfigError(f"kubernetes.grace_seconds must be a whole number of seconds, not {grace!r}")
    return DrainSettings(
        force=force,
        grace_seconds=grace,
        retry_pause_s=_number(kube, "retry_pause_s", 5, section="kubernetes"),
        poll_s=_number(kube, "poll_s", 2, section="kubernetes"),
    )


def load_config(path: str, *, default_worker: str) -> KubeDrainerConfig:
    """Read and check the TOML file; ConfigError (one line) for anything wrong."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    api, kube, nodes = _table(doc, "api"), _table(doc, "kubernetes"), _table(doc, "nodes")
    url = api.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"api.url must be an http:// or https:// URL, not {url!r}")
    kubeconfig = kube.get("kubeconfig")
    if kubeconfig is not None:
        kubeconfig = str(Path(path).parent / str(kubeconfig))
        if not Path(kubeconfig).is_file():
            raise ConfigError(f"kubernetes.kubeconfig {kubeconfig} does not exist (leave it out to run in-cluster)")
    pattern, mapping = _nodes(nodes)
    return KubeDrainerConfig(
        api_url=url,
        token=_token(api, Path(path).parent),
        worker=str(api.get("worker") or default_worker),
        timeout_s=_number(api, "timeout_s", 30, section="api"),
        backoff_cap_s=_number(api, "backoff_cap_s", 60, section="api", minimum=1),
        kubeconfig=kubeconfig,
        context=str(kube["context"]) if kube.get("context") else None,
        drain=_drain_settings(kube),
        poll_interval_s=_number(kube, "poll_interval_s", 5, section="kubernetes"),
        lease_s=int(_number(kube, "lease_s", 120, section="kubernetes", minimum=3)),
        deadline_margin_s=_number(kube, "deadline_margin_s", 15, section="kubernetes", minimum=0),
        max_items=int(_number(kube, "max_items", 20, section="kubernetes", minimum=1)),
        node_pattern=pattern,
        node_map=mapping,
    )


def kube_client(config: KubeDrainerConfig) -> Client:
    """A lightkube client from the kubeconfig (or the service account); ConfigError when unusable."""
    kube_config: SingleConfig | KubeConfig | None
    try:
        if config.kubeconfig:
            kube_config = KubeConfig.from_file(config.kubeconfig).get(config.context)
        else:
            kube_config = KubeConfig.from_service_account()
    except (KubeConfigError, OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
        where = config.kubeconfig or "the in-cluster service account"
        first_line = " ".join(str(error).split())[:300]  # YAML errors span lines; the key is one
        raise ConfigError(f"kubernetes: cannot use {where}: {type(error).__name__}: {first_line}") from None
    if kube_config is None:
        raise ConfigError(f"kubernetes.context {config.context!r} is not in {config.kubeconfig}")
    timeout = httpx2.Timeout(config.timeout_s)
    return Client(kube_config, timeout=timeout, field_manager="opsplanner-kube-drainer")


def _seconds_left(item: dict[str, Any], margin_s: float) -> float:
    """Until the item's deadline less the margin, so that our report (naming the pods) arrives
    before the tick expires the item with a reason that names nothing."""
    deadline = item.get("deadline_at")
    if not deadline:
        return DEFAULT_DRAIN_S
    at = dt.datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    left = (at - dt.datetime.now(dt.UTC)).total_seconds()
    return max(0.0, left - min(margin_s, left / 4))


def _details(outcome: Outcome) -> str:
    """The result as text (the API keeps `details`, up to 2000 characters)."""
    result = outcome.result
    parts = [f"node {result.get('node')}"]
    for key in ("evicted", "refused"):
        if result.get(key):
            parts.append(f"{key}: {', '.join(result[key])}")
    for kind, pods in (result.get("skipped") or {}).items():
        if pods:
            parts.append(f"skipped ({kind}): {', '.join(pods)}")
    if result.get("blocking"):
        parts.append("blocking: " + "; ".join(f"{pod} {why}" for pod, why in result["blocking"].items()))
    return "; ".join(parts)[:2000]


class KubeDrainerProcess:
    """The process's state: one thread per item in progress. `step()` claims what fits."""

    def __init__(
        self,
        config: KubeDrainerConfig,
        *,
        stop: Callable[[], bool],
        client: ApiClient | None = None,
        drainer: KubeDrainer | None = None,
    ) -> None:
        self.config = config
        self.stop = stop
        self.api = client or ApiClient(config.api_url, config.token, config.worker, timeout_s=config.timeout_s)
        self.drainer = drainer or KubeDrainer(kube_client(config), config.drain)
        self.threads: dict[int, threading.Thread] = {}

    def step(self) -> None:
        """Forget finished threads and claim as many items as there is room for (ApiUnreachable,
        ApiError propagate to the loop, which backs off)."""
        self.threads = {item_id: t for item_id, t in self.threads.items() if t.is_alive()}
        room = self.config.max_items - len(self.threads)
        if room <= 0:
            return
        items = self.api.claim(adapter=ADAPTER, kinds=KINDS, limit=room, lease_seconds=self.config.lease_s)
        for item in items:
            thread = threading.Thread(target=self.work, args=(item,), name=f"item-{item['id']}", daemon=True)
            self.threads[item["id"]] = thread
            thread.start()

    def work(self, item: dict[str, Any]) -> None:
        node = self.config.node_name(str(item.get("hostname") or ""))
        log.info("claimed %s item %s for host %s (node %s)", item["kind"], item["id"], item.get("hostname"), node)
        try:
            outcome = self._drain(item, node) if item["kind"] == "drain" else self.undrain(node)
        except Exception as error:  # a thread's failure is the item's: reported, not lost
            log.exception("item %s", item["id"])
            outcome = Outcome(False, f"node {node}: the drainer failed: {type(error).__name__}: {error}")
        if outcome.abandoned:
            log.warning("item %s: %s; leaving node %s as it is", item["id"], outcome.reason, node)
            return
        self._report(item, outcome)

    def _drain(self, item: dict[str, Any], node: str) -> Outcome:
        subject = f"operation {item['operation']}" if item.get("operation") else f"task {item.get('host_task')}"
        owner = f"opsplanner: {subject} item {item['id']}"
        deadline = time.monotonic() + _seconds_left(item, self.config.deadline_margin_s)
        beat = {"at": time.monotonic()}

        def keep_going() -> bool:
            if self.stop():
                return False
            if time.monotonic() - beat["at"] < self.config.lease_s / 3:
                return True
            try:
                still_ours = self.api.heartbeat(item, lease_seconds=self.config.lease_s)
            except (ApiUnreachable, ApiError) as error:
                log.warning("heartbeat of item %s: %s", item["id"], error)
                return True  # the lease has room for a few misses; the drain goes on
            beat["at"] = time.monotonic()
            return still_ours

        return self.drainer.drain(node, owner=owner, deadline=deadline, keep_going=keep_going)

    def undrain(self, node: str) -> Outcome:
        outcome = self.drainer.undrain(node)
        if outcome.result.get("cordoned_by_someone_else"):
            # Not counted in service while Kubernetes keeps it out: the host goes to repair instead.
            reason = f"node {node} is cordoned by someone else; opsplanner does not uncordon a node it did not cordon"
            return Outcome(False, reason, outcome.result)
        return outcome

    def _report(self, item: dict[str, Any], outcome: Outcome) -> None:
        key = f"kubernetes-{item['id']}-{item['attempt']}"
        result = {"details": _details(outcome)}
        backoff = Backoff(base_s=min(1.0, self.config.poll_interval_s), cap_s=self.config.backoff_cap_s)
        while True:
            try:
                self.api.report(item, ok=outcome.ok, reason=outcome.reason, result=result, report_key=key)
            except ApiUnreachable as error:
                if self.stop():
                    return  # the lease runs out and the item is done again by whoever claims it
                delay = backoff.next_delay()
                log.warning("report of item %s: %s; retrying in %.1fs", item["id"], error, delay)
                _sleep(delay, self.stop)
                continue
            except ApiError as error:
                # Finished by the tick already (its deadline passed) or taken back: nothing more to say.
                log.warning("report of item %s refused: %s", item["id"], error)
                return
            log.info("item %s %s: %s", item["id"], "done" if outcome.ok else "failed", outcome.reason)
            return

    def join(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for thread in self.threads.values():
            thread.join(max(0.0, end - time.monotonic()))


def run(config: KubeDrainerConfig, *, stop: Callable[[], bool]) -> None:
    process = KubeDrainerProcess(config, stop=stop)
    backoff = Backoff(base_s=config.poll_interval_s, cap_s=config.backoff_cap_s)
    log.info("claiming %s items at %s as %s", ", ".join(KINDS), config.api_url, config.worker)
    while not stop():
        try:
            process.step()
            backoff.reset()
            delay = config.poll_interval_s
        except ApiUnreachable as error:
            delay = backoff.next_delay()
            log.warning("API unreachable (%s); next try in %.1fs", error, delay)
        except ApiError as error:
            delay = backoff.next_delay()
            log.error("the API refused the claim: %s; next try in %.1fs", error, delay)
        _sleep(delay, stop)
    process.join(timeout_s=config.drain.retry_pause_s + config.timeout_s)


def _sleep(seconds: float, stop: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while not stop() and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opsplanner-kube-drainer", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the TOML configuration file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per Kubernetes request drowns ours
    try:
        config = load_config(args.config, default_worker=f"kube-drainer@{socket.gethostname()}")
        kube_client(config).close()  # a kubeconfig that cannot be used is a configuration error, said now
    except ConfigError as error:
        print(f"opsplanner-kube-drainer: {error}", file=sys.stderr)
        return 2
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    run(config, stop=lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
