"""The SSH executor: a central process that runs the step protocol on hosts over SSH, for fleets
that will not run an agent.

    opsplanner-ssh-executor --config /etc/opsplanner/ssh-executor.toml

It claims the execute and verify items whose adapter is "ssh", runs each through a StepRunner on
an SshTransport to its host while heartbeating, and reports. The StepRunner's state lives on this
machine (one file per host and item under `state_dir`), and each claimed item is recorded there
until reported, so a restarted executor resumes the items it still holds; those it lost come back
through the lease and the state makes the check decide. See docs/adapters.md, "SSH executor"."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff, Heartbeat
from opsplanner_adapters.config import ConfigError, api_settings, path_setting, positive, read_toml, setting
from opsplanner_adapters.ssh import BOOT_ID_ARGV, SshError, SshHost, SshOptions, SshTransport
from opsplanner_adapters.steps import (
    TAIL_BYTES,
    Abandon,
    Outcome,
    RebootPending,
    StateStore,
    StepConfig,
    StepRunner,
    step_config_from,
)

ADAPTER = "ssh"
KINDS = ("execute", "verify")
# The API keeps a step's output tail up to 8192 characters.
MAX_TAIL_BYTES = 8192
log = logging.getLogger("opsplanner.ssh_executor")


@dataclass(frozen=True)
class ExecutorConfig:
    api_url: str
    token: str
    api_timeout_s: float
    worker: str
    hosts: dict[str, SshHost]
    ssh: SshOptions
    state_dir: Path
    concurrency: int
    lease_seconds: int
    wait_seconds: int
    pool: int | None
    steps: StepConfig  # the same tables as the agent's: components, verify, reboot, repair


# -- configuration ------------------------------------------------------------------------------------
def _hosts(doc: Mapping[str, Any], base: Path) -> dict[str, SshHost]:
    """[hosts.NAME] tables; port, user and key_file default to those of [ssh]."""
    defaults = {k: v for k, v in setting(doc, "ssh", dict, "the file", {}).items() if k in ("port", "user", "key_file")}
    hosts = setting(doc, "hosts", dict, "the file")
    if not hosts:
        raise ConfigError("[hosts]: name at least one host ([hosts.NAME] with address and key_file)")
    result = {}
    for name, table in hosts.items():
        where = f"[hosts.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table with address, port, user and key_file")
        merged = {**defaults, **table}
        host = SshHost(
            name=name,
            address=setting(merged, "address", str, where),
            port=setting(merged, "port", int, where, 22),
            user=setting(merged, "user", str, where, "root"),
            key_file=path_setting(merged, "key_file", where, base),
        )
        if not 0 < host.port < 65536:
            raise ConfigError(f"{where}: `port` must be 1 to 65535, not {host.port}")
        if not host.key_file.is_file():
            raise ConfigError(f"{where}: the key file {host.key_file} does not exist")
        result[name] = host
    return result


def _ssh_options(doc: Mapping[str, Any], base: Path) -> SshOptions:
    table = setting(doc, "ssh", dict, "the file", {})
    where = "[ssh]"
    boot_id = setting(table, "boot_id_command", list, where, list(BOOT_ID_ARGV))
    if not boot_id or not all(isinstance(part, str) for part in boot_id):
        raise ConfigError(f"{where}: `boot_id_command` must be a non-empty list of strings")
    known_hosts = path_setting(table, "known_hosts", where, base)
    if not known_hosts.is_file():
        raise ConfigError(f"{where}: the known_hosts file {known_hosts} does not exist")
    return SshOptions(
        known_hosts=known_hosts,
        boot_id_argv=tuple(boot_id),
        connect_timeout_s=positive(table, "connect_timeout_s", where, 10),
        output_tail_bytes=_tail_bytes(setting(table, "output_tail_bytes", int, where, TAIL_BYTES)),
        reboot_timeout_s=positive(table, "reboot_timeout_s", where, 900),
        reboot_poll_s=positive(table, "reboot_poll_s", where, 3),
    )


def _tail_bytes(value: int) -> int:
    if not 256 <= value <= MAX_TAIL_BYTES:
        raise ConfigError(f"[ssh]: `output_tail_bytes` must be 256 to {MAX_TAIL_BYTES}, not {value}")
    return value


def config_load(path: Path) -> ExecutorConfig:
    """Read and check the TOML file; relative paths are relative to the file's folder."""
    doc = read_toml(path)
    base = path.resolve().parent
    api = api_settings(doc, base=base, default_worker=f"ssh-executor@{socket.gethostname()}")
    executor = setting(doc, "executor", dict, "the file", {})
    concurrency = setting(executor, "concurrency", int, "[executor]", 4)
    if not 1 <= concurrency <= 256:
        raise ConfigError(f"[executor]: `concurrency` must be 1 to 256, not {concurrency}")
    lease_seconds = setting(executor, "lease_seconds", int, "[executor]", 300)
    wait_seconds = setting(executor, "wait_seconds", int, "[executor]", 10)
    if not 2 <= lease_seconds <= 86400 or not 0 <= wait_seconds <= 60:
        raise ConfigError("[executor]: `lease_seconds` must be 2 to 86400 and `wait_seconds` 0 to 60")
    return ExecutorConfig(
        api_url=api.url,
        token=api.token,
        api_timeout_s=api.timeout_s,
        worker=api.worker,
        hosts=_hosts(doc, base),
        ssh=_ssh_options(doc, base),
        state_dir=_state_dir(path_setting(executor, "state_dir", "[executor]", base)),
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        wait_seconds=wait_seconds,
        pool=setting(executor, "pool", int, "[executor]", None),
        steps=_steps_config(doc),
    )


def _state_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"[executor]: cannot create the state_dir {path}: {error.strerror or error}") from None
    return path


def _steps_config(doc: Mapping[str, Any]) -> StepConfig:
    """[steps]: the agent's format (components, verify, reboot, reboot_exit_code, repair)."""
    table = setting(doc, "steps", dict, "the file", {})
    try:
        steps = step_config_from(table)
    except ConfigError as error:
        raise ConfigError(f"[steps]: {error}") from None
    if not steps.components and not steps.verify:
        raise ConfigError("[steps]: configure [steps.components.NAME] (install, check) and [steps.verify.CLASS]")
    return steps


# -- the process ----------------------------------------------------------------------------------------
class Executor:
    """Worker threads that claim ssh items, run them on their hosts and report them."""

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config
        self.client = ApiClient(config.api_url, config.token, config.worker, config.api_timeout_s)
        self.stopping = threading.Event()
        self.fatal: str | None = None
        self._resume: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._host_locks = {name: threading.Lock() for name in config.hosts}

    def serve(self) -> int:
        """Run until stopped (stop()) or a fatal refusal; the exit status."""
        self._resume = self._saved_items()
        threads = [
            threading.Thread(target=self._work, name=f"ssh-worker-{n}", daemon=True)
            for n in range(self.config.concurrency)
        ]
        for thread in threads:
            thread.start()
        log.info("ssh executor %s: %d hosts, %d threads", self.config.worker, len(self.config.hosts), len(threads))
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(0.5)
        if self.fatal:
            log.error("%s", self.fatal)
            return 2
        return 0

    def stop(self) -> None:
        self.stopping.set()

    def _store(self, host: str) -> StateStore:
        return StateStore(self.config.state_dir / host)

    def _saved_items(self) -> list[dict[str, Any]]:
        """Items with a state on disk: ours still (resumed) or lost (their state waits for the next claim)."""
        saved = []
        for folder in sorted(p for p in self.config.state_dir.iterdir() if p.is_dir()):
            saved += [state["item"] for state in StateStore(folder).all() if isinstance(state.get("item"), dict)]
        return saved

    def _next(self, backoff: Backoff) -> dict[str, Any] | None:
        with self._lock:
            resumed = self._resume.pop(0) if self._resume else None
        if resumed is not None:
            return self._still_ours(resumed)
        items = self.client.claim(
            adapter=ADAPTER,
            kinds=KINDS,
            pool=self.config.pool,
            limit=1,
            lease_seconds=self.config.lease_seconds,
            wait_seconds=self.config.wait_seconds,
        )
        backoff.reset()
        return items[0] if items else None

    def _still_ours(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """A saved item after a restart: resume it if its claim still holds; forget it once finished."""
        try:
            if self.client.heartbeat(item, lease_seconds=self.config.lease_seconds):
                log.info("resuming item %s on %s (attempt %s)", item["id"], item.get("hostname"), item["attempt"])
                return item
            now = self.client.item(item["id"])
        except ApiUnreachable:
            with self._lock:
                self._resume.append(item)
            raise
        except ApiError as error:
            if error.status != 404:
                log.warning("cannot tell whether item %s is still ours (%s); keeping its state", item["id"], error)
                return None
            now = {"state": "gone"}
        if now.get("state") in ("done", "failed", "gone"):
            self._store(str(item.get("hostname"))).delete(item["id"])
        return None

    def _work(self) -> None:
        backoff = Backoff(base_s=1, cap_s=60)
        while not self.stopping.is_set():
            try:
                item = self._next(backoff)
                if item is not None:
                    self._do(item)
            except ApiUnreachable as error:
                delay = backoff.next_delay()
                log.warning("the API is unreachable (%s); trying again in %.1fs", error, delay)
                self.stopping.wait(delay)
            except ApiError as error:
                if error.status in (401, 403):
                    self.fatal = f"the API refused this executor's token ({error}); check [api] token"
                    self.stopping.set()
                    return
                log.error("the API refused a request: %s", error)
                self.stopping.wait(backoff.next_delay())
            except Exception:  # a bug must not silently end a worker thread; the lease takes the item back
                log.exception("unexpected error; the item's lease will give it back")
                self.stopping.wait(backoff.next_delay())

    def _do(self, item: dict[str, Any]) -> None:
        name = str(item.get("hostname") or "")
        host = self.config.hosts.get(name)
        if host is None:
            reason = f"host {name!r} is not in this SSH executor's configuration ([hosts.{name}])"
            self._report(item, Outcome(False, reason, {}))
            return
        # Heartbeat first: waiting for another item of the same host must not lose this one's lease.
        with Heartbeat(self.client, item, lease_seconds=self.config.lease_seconds) as beat, self._host_locks[name]:
            outcome = self._run(item, host)
        if outcome is None:
            return
        if beat.lost:
            return  # not ours any more: the state stays for the next claim, whose check decides
        if self._report(item, outcome):
            self._store(name).delete(item["id"])

    def _run(self, item: dict[str, Any], host: SshHost) -> Outcome | None:
        """The item's outcome, or None when the claim is given up (the lease brings it back)."""
        running = self.config.state_dir / host.name / "running.json"
        running.parent.mkdir(exist_ok=True)
        transport = SshTransport(host, self.config.ssh, running_file=running)
        try:
            transport.connect()  # a refused host key fails the item before any state or command
            return StepRunner(transport, self._store(host.name), self.config.steps).run(item)
        except SshError as error:
            log.warning("item %s on %s failed over SSH: %s", item["id"], host.name, error)
            return Outcome(False, str(error), {})
        except (Abandon, RebootPending) as error:
            log.warning("giving item %s up: %s", item["id"], error)
            return None
        finally:
            transport.close()

    def _report(self, item: Mapping[str, Any], outcome: Outcome) -> bool:
        """Report until the API answers; True if accepted (a stop leaves the outcome in the state)."""
        backoff = Backoff(base_s=1, cap_s=30)
        return self.client.report_until_answered(
            item, ok=outcome.ok, reason=outcome.reason, result=outcome.result, backoff=backoff, stopping=self.stopping
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="opsplanner-ssh-executor", description="Run OpsPlanner's upgrade steps on hosts over SSH."
    )
    parser.add_argument("--config", required=True, type=Path, help="the TOML configuration file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    logging.getLogger("paramiko").setLevel(logging.WARNING)  # not a line per connection
    try:
        config = config_load(args.config)
    except ConfigError as error:
        print(f"opsplanner-ssh-executor: {args.config}: {error}", file=sys.stderr)
        return 2
    executor = Executor(config)

    def on_signal(signum: int, _frame: object) -> None:
        if executor.stopping.is_set():
            os._exit(1)  # a second signal: leave now; the state dir lets the next start resume
        log.info("stopping after the items in hand (signal %d; again to leave at once)", signum)
        executor.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return executor.serve()


if __name__ == "__main__":
    sys.exit(main())
