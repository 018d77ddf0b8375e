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

import datetime as dt
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, Backoff
from opsplanner_adapters.config import ConfigError, number, table
from opsplanner_adapters.drainer_loop import (
    DrainerSettings,
    NodeRules,
    claim_what_fits,
    deadline_of,
    drainer_main,
    drainer_settings,
    heartbeat_if_due,
    item_subject,
    report,
    run_loop,
    sleep_unless_stopped,
)

try:
    import httpx2
    import yaml
    from lightkube import Client, KubeConfig, SingleConfig
    from lightkube import ConfigError as KubeConfigError

    from opsplanner_adapters.kubernetes import DrainSettings, KubeDrainer, Outcome
except ModuleNotFoundError as missing:  # the `kubernetes` extra: one line, not a traceback
    sys.exit(f"opsplanner-kube-drainer: {missing.name} is not installed: pip install 'opsplanner-adapters[kubernetes]'")

ADAPTER = "kubernetes"
DEFAULT_DRAIN_S = 3600.0  # an item without a deadline (the API always gives one)
log = logging.getLogger("opsplanner.kube_drainer")


@dataclass(frozen=True)
class KubeDrainerConfig(DrainerSettings):
    kubeconfig: str | None = None  # None: the pod's service account (in-cluster)
    context: str | None = None
    drain: DrainSettings = field(default_factory=DrainSettings)

    def node_name(self, hostname: str) -> str:
        """The host's Kubernetes node: the mapping, else the pattern over its name."""
        return self.named_node(hostname)


NODES = NodeRules(
    default_pattern="{hostname}",
    valid=re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),  # a DNS subdomain, as nodes are named
    described_as="Kubernetes node names (lower-case DNS names)",
)


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
        retry_pause_s=number(kube, "retry_pause_s", 5, section="kubernetes"),
        poll_s=number(kube, "poll_s", 2, section="kubernetes"),
    )


def load_config(path: str, *, default_worker: str) -> KubeDrainerConfig:
    """Read and check the TOML file; ConfigError (one line) for anything wrong."""
    doc, common = drainer_settings(path, section="kubernetes", default_worker=default_worker, max_items=20, nodes=NODES)
    kube = table(doc, "kubernetes")
    kubeconfig = kube.get("kubeconfig")
    if kubeconfig is not None:
        kubeconfig = str(Path(path).parent / str(kubeconfig))
        if not Path(kubeconfig).is_file():
            raise ConfigError(f"kubernetes.kubeconfig {kubeconfig} does not exist (leave it out to run in-cluster)")
    return KubeDrainerConfig(
        **vars(common),
        kubeconfig=kubeconfig,
        context=str(kube["context"]) if kube.get("context") else None,
        drain=_drain_settings(kube),
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
    at = deadline_of(item)
    if at is None:
        return DEFAULT_DRAIN_S
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
        self.api = client or config.api_client()
        self.drainer = drainer or KubeDrainer(kube_client(config), config.drain)
        self.threads: dict[int, threading.Thread] = {}

    def step(self) -> None:
        """Forget finished threads and claim as many items as there is room for (ApiUnreachable,
        ApiError propagate to the loop, which backs off)."""
        self.threads = {item_id: t for item_id, t in self.threads.items() if t.is_alive()}
        for item in claim_what_fits(self.api, self.config, adapter=ADAPTER, in_hand=len(self.threads)):
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
        owner = f"opsplanner: {item_subject(item)}"
        deadline = time.monotonic() + _seconds_left(item, self.config.deadline_margin_s)
        beat = {"at": time.monotonic()}

        def keep_going() -> bool:
            if self.stop():
                return False
            still_ours, beat["at"] = heartbeat_if_due(
                self.api, item, last_at=beat["at"], lease_s=self.config.lease_s, log=log
            )
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
        """Report until the API answers; on stop, leave it to the lease (the item is done again)."""
        backoff = Backoff(base_s=min(1.0, self.config.poll_interval_s), cap_s=self.config.backoff_cap_s)
        details = _details(outcome)
        while not report(
            self.api, item, adapter=ADAPTER, ok=outcome.ok, reason=outcome.reason, details=details, log=log
        ):
            if self.stop():
                return
            sleep_unless_stopped(backoff.next_delay(), self.stop)

    def join(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for thread in self.threads.values():
            thread.join(max(0.0, end - time.monotonic()))


def run(config: KubeDrainerConfig, *, stop: Callable[[], bool]) -> None:
    process = KubeDrainerProcess(config, stop=stop)
    run_loop(process, config, stop=stop, log=log)
    process.join(timeout_s=config.drain.retry_pause_s + config.timeout_s)


def _checked_config(path: str) -> KubeDrainerConfig:
    config = load_config(path, default_worker=f"kube-drainer@{socket.gethostname()}")
    kube_client(config).close()  # a kubeconfig that cannot be used is a configuration error, said now
    return config


def main(argv: list[str] | None = None) -> int:
    return drainer_main(
        argv,
        prog="opsplanner-kube-drainer",
        description=__doc__.splitlines()[0],
        load=_checked_config,
        run=lambda config, stop: run(config, stop=stop),
        quiet_loggers=("httpx2",),  # a line per Kubernetes request drowns ours
    )


if __name__ == "__main__":
    sys.exit(main())
