"""The step protocol: how an executor (the host agent, the SSH executor) does one work item on a host.

Per component, an install command (argv, `{version}` substituted) and a check command whose
stripped output is the version the host runs. An upgrade item runs:

    check                  already at the target: done, nothing installed
    install                recorded (attempt, boot id) in the item's state file BEFORE it starts
      exit code reserved   (default 194) "reboot needed": recorded as rebooting, then the reboot
      after a new boot id  the check only, never the install again
    check                  equal to the target: done; otherwise failed

A verify item runs its class's command (health, burn_in, collective): exit 0 passes. A reboot item
reboots and waits for a new boot id; a repair item puts back the versions in `params.restore`.

The state file (one JSON file per item, written atomically) is what makes a crash harmless: the
install of an item never runs twice in the same claim attempt. When a crash interrupted an install
(recorded, never finished), the runner gives the claim up (`Abandon`): the lease runs out, the
item comes back with a new attempt, and the check decides whether it runs once more.

Every command run goes into the report's `result.steps` (name, exit code, output tail, duration,
timed out, attempt) and the versions measured by the checks into `result.versions`, which is what
the tick records for the host.

`Transport` is what the runner needs from a host: `run(argv, timeout_s=) -> CommandResult`,
`boot_id()` and `reboot(argv)`. A transport's reboot may return before the host goes down (a local
agent is killed by its own reboot) or after it came back (SSH); the runner compares boot ids."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from opsplanner_adapters.config import ConfigError as ConfigError  # re-exported: the step tables' errors
from opsplanner_adapters.config import finite
from opsplanner_adapters.running import TAG_VARIABLE, RunningRecord

REBOOT_NEEDED = 194
TAIL_BYTES = 4096
DEFAULT_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
VERIFY_CLASSES = ("health", "burn_in", "collective")
MAX_REBOOT_REQUESTS = 2
# The API keeps a measured version up to 64 characters and refuses a report with a NUL anywhere:
# a report it refuses is lost (never accepted, the item only comes back through its lease).
MAX_VERSION = 64


class CommandResult(NamedTuple):
    """What one command did: exit code (None when it was killed or could not start), the last bytes
    of its output (stdout and stderr together), how long it ran and whether it ran out of time."""

    exit_code: int | None
    output_tail: str
    duration_s: float
    timed_out: bool


class Transport(Protocol):
    def run(self, argv: list[str], *, timeout_s: float) -> CommandResult: ...

    def boot_id(self) -> str: ...

    def reboot(self, argv: list[str]) -> None: ...


class Abandon(Exception):
    """Give the claim up without a report: the lease runs out and the item is claimed again."""


class RebootPending(Exception):
    """The reboot was asked for and the host has not rebooted yet: wait (the agent is killed by it)."""


@dataclass(frozen=True)
class ComponentSteps:
    install: tuple[str, ...]
    check: tuple[str, ...]
    allowed_exit_codes: frozenset[int] = frozenset({0})
    timeout_s: float = 1800.0
    check_timeout_s: float = 120.0


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class StepConfig:
    components: Mapping[str, ComponentSteps]
    verify: Mapping[str, Command] = field(default_factory=dict)
    reboot: tuple[str, ...] = ("systemctl", "reboot")
    reboot_exit_code: int = REBOOT_NEEDED
    repair: Command | None = None


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(part, str) for part in value):
        raise ConfigError(f"{where} must be a non-empty list of strings (an argv)")
    return tuple(value)


def _seconds(value: Any, where: str, default: float) -> float:
    if value is None:
        return default
    if not finite(value) or value <= 0:
        raise ConfigError(f"{where} must be a positive number of seconds")
    return float(value)


def step_config_from(data: Mapping[str, Any]) -> StepConfig:
    """The step configuration from a parsed document (TOML tables `components.<name>`, `verify.<class>`,
    `reboot`, `reboot_exit_code`, `repair`); ConfigError naming the first bad key."""
    components: dict[str, ComponentSteps] = {}
    for name, table in dict(data.get("components") or {}).items():
        where = f"components.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table")
        codes = table.get("allowed_exit_codes", [0])
        if not isinstance(codes, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
            raise ConfigError(f"{where}.allowed_exit_codes must be a list of integers")
        components[name] = ComponentSteps(
            install=_argv(table.get("install"), f"{where}.install"),
            check=_argv(table.get("check"), f"{where}.check"),
            allowed_exit_codes=frozenset(codes),
            timeout_s=_seconds(table.get("timeout_s"), f"{where}.timeout_s", 1800.0),
            check_timeout_s=_seconds(table.get("check_timeout_s"), f"{where}.check_timeout_s", 120.0),
        )
    verify: dict[str, Command] = {}
    for name, table in dict(data.get("verify") or {}).items():
        where = f"verify.{name}"
        if name not in VERIFY_CLASSES:
            raise ConfigError(f"{where}: unknown verification class; use {', '.join(VERIFY_CLASSES)}")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table")
        verify[name] = Command(
            _argv(table.get("command"), f"{where}.command"),
            _seconds(table.get("timeout_s"), f"{where}.timeout_s", 1800.0),
        )
    reboot_code = data.get("reboot_exit_code", REBOOT_NEEDED)
    if not isinstance(reboot_code, int) or isinstance(reboot_code, bool) or not 1 <= reboot_code <= 255:
        raise ConfigError("reboot_exit_code must be an integer from 1 to 255")
    repair = data.get("repair")
    return StepConfig(
        components=components,
        verify=verify,
        reboot=_argv(data["reboot"], "reboot") if "reboot" in data else ("systemctl", "reboot"),
        reboot_exit_code=reboot_code,
        repair=Command(
            _argv(repair.get("command"), "repair.command"),
            _seconds(repair.get("timeout_s"), "repair.timeout_s", 1800.0),
        )
        if isinstance(repair, Mapping)
        else None,
    )


# -- the state of an item, on disk -----------------------------------------------------------------


class StateStore:
    """One JSON file per item under a directory, replaced atomically (write, fsync, rename)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, item_id: int) -> Path:
        return self.directory / f"item-{int(item_id)}.json"

    def load(self, item_id: int) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(item_id).read_text())
        except FileNotFoundError:
            return None

    def save(self, item_id: int, state: Mapping[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".item-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as sink:
                json.dump(state, sink, sort_keys=True)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(tmp, self.path(item_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self, item_id: int) -> None:
        self.path(item_id).unlink(missing_ok=True)

    def all(self) -> list[dict[str, Any]]:
        """Every item's state, oldest item first (what to resume after a restart)."""
        states = []
        for path in sorted(self.directory.glob("item-*.json"), key=lambda p: int(p.stem.split("-")[1])):
            try:
                states.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # never written half (atomic rename); unreadable means someone edited it
        return states


class Outcome(NamedTuple):
    ok: bool
    reason: str
    result: dict[str, Any]


class _Failed(Exception):
    pass


def _step(name: str, result: CommandResult, attempt: int) -> dict[str, Any]:
    return {
        "name": name,
        "exit_code": result.exit_code,
        "output_tail": result.output_tail,
        "duration_s": round(result.duration_s, 3),
        "timed_out": result.timed_out,
        "attempt": attempt,
    }


class StepRunner:
    """Does one item on one host through a transport, keeping its progress in the state store.
    `run(item)` answers the outcome to report; it raises Abandon or RebootPending (see the module)."""

    def __init__(
        self,
        transport: Transport,
        store: StateStore,
        config: StepConfig,
        *,
        on_step: Callable[[dict], None] | None = None,
    ) -> None:
        self.transport, self.store, self.config = transport, store, config
        self.on_step = on_step

    def run(self, item: Mapping[str, Any]) -> Outcome:
        state = self.store.load(item["id"]) or {"item": dict(item), "installs": [], "reboot": None}
        if state.get("outcome") and state.get("attempt") == item["attempt"]:
            return Outcome(*state["outcome"])  # worked out before a crash, not yet reported
        if state.get("attempt") != item["attempt"]:
            state.update(item=dict(item), attempt=item["attempt"], steps=[], versions={}, outcome=None)
        self._state = state
        try:
            outcome = self._verify(item) if item["kind"] == "verify" else self._execute(item)
        except _Failed as failure:
            outcome = Outcome(False, str(failure), self._result())
        state["outcome"] = list(outcome)
        self._save()
        return outcome

    def forget(self, item_id: int) -> None:
        """The item was reported: its state is no longer needed."""
        self.store.delete(item_id)

    # -- item kinds -------------------------------------------------------------------------------
    def _execute(self, item: Mapping[str, Any]) -> Outcome:
        params = item.get("params") or {}
        kind = params.get("kind")
        if kind == "upgrade" and params.get("component"):
            self._apply(params["component"], params["version"])
            return Outcome(True, "", self._result())
        if kind == "reboot":
            self._reboot_then(None)
            return Outcome(True, "", self._result())
        if kind == "repair":
            for component, version in sorted((params.get("restore") or {}).items()):
                self._apply(component, version)
            if self.config.repair is not None:
                self._command("repair", self.config.repair)
            return Outcome(True, "", self._result())
        if kind == "verification":
            return self._verify_class("health")
        raise _Failed(f"cannot do an execute item of kind {kind!r} (params {dict(params)})")

    def _verify(self, item: Mapping[str, Any]) -> Outcome:
        return self._verify_class(item.get("verify_class") or "health")

    def _verify_class(self, name: str) -> Outcome:
        command = self.config.verify.get(name)
        if command is None:
            raise _Failed(f"no command is configured for the {name} verification (verify.{name}.command)")
        result = self._command(f"verify:{name}", command, fail=False)
        passed = result.exit_code == 0 and not result.timed_out
        details = f"{name} {'passed' if passed else 'failed'}: {_summary(result)}"
        return Outcome(
            True, "" if passed else details[:500], {**self._result(), "passed": passed, "details": details[:2000]}
        )

    # -- the upgrade of one component ---------------------------------------------------------------
    def _apply(self, component: str, version: str) -> None:
        steps = self.config.components.get(component)
        if steps is None:
            raise _Failed(f"no steps are configured for component {component!r} (components.{component})")
        pending = self._state.get("reboot")
        if pending and pending.get("component") == component:
            self._reboot_then(component)
            return self._expect(component, steps, version, "after the reboot")
        if self._check(component, steps) == version:
            return None
        self._install(component, steps, version)
        return self._expect(component, steps, version, "after the install")

    def _install(self, component: str, steps: ComponentSteps, version: str) -> None:
        attempt = self._state["attempt"]
        done_before = [
            i
            for i in self._state["installs"]
            if i["component"] == component and i["version"] == version and i["attempt"] == attempt
        ]
        if done_before:
            if done_before[-1]["exit_code"] is None:
                raise Abandon(
                    f"the install of {component} {version} in attempt {attempt} was interrupted; giving the claim up"
                )
            return  # it finished before a crash; the check that follows decides
        record = {
            "component": component,
            "version": version,
            "attempt": attempt,
            "boot_id": self.transport.boot_id(),
            "exit_code": None,
            "started_at": time.time(),
        }
        self._state["installs"].append(record)
        self._save()  # before the install starts: a crash from here on is known
        argv = [part.replace("{version}", version) for part in steps.install]
        result = self._record(f"install:{component}", self.transport.run(argv, timeout_s=steps.timeout_s))
        record["exit_code"] = result.exit_code if result.exit_code is not None else -1
        self._save()
        if result.timed_out:
            raise _Failed(
                f"the install of {component} {version} timed out after {steps.timeout_s:.0f}s: {_summary(result)}"
            )
        if result.exit_code == self.config.reboot_exit_code:
            self._state["reboot"] = {"component": component, "boot_id": record["boot_id"], "requests": 0}
            self._reboot_then(component)
        elif result.exit_code not in steps.allowed_exit_codes:
            raise _Failed(f"the install of {component} {version} exited {result.exit_code}: {_summary(result)}")

    def _reboot_then(self, component: str | None) -> None:
        """Reboot (once, or again if the host did not go down) and return on a new boot id."""
        pending = self._state.get("reboot")
        if not pending:
            pending = self._state["reboot"] = {
                "component": component,
                "boot_id": self.transport.boot_id(),
                "requests": 0,
            }
        if self.transport.boot_id() == pending["boot_id"]:
            if pending["requests"] >= MAX_REBOOT_REQUESTS:
                raise _Failed(f"the host did not reboot after {pending['requests']} reboot commands")
            pending["requests"] += 1
            self._save()  # "rebooting": after a restart, a new boot id means the reboot happened
            started = time.monotonic()
            try:
                self.transport.reboot(list(self.config.reboot))
            except Exception as error:  # noqa: BLE001 - each transport says why in its own error type
                raise _Failed(f"the reboot failed: {error}") from None
            self._state["steps"].append(
                {
                    "name": "reboot",
                    "exit_code": 0,
                    "output_tail": "",
                    "duration_s": round(time.monotonic() - started, 3),
                    "timed_out": False,
                    "attempt": self._state["attempt"],
                }
            )
            if self.transport.boot_id() == pending["boot_id"]:
                self._save()
                raise RebootPending("the reboot was asked for; waiting for the host to go down")
        self._state["reboot"] = None
        self._save()

    def _check(self, component: str, steps: ComponentSteps) -> str | None:
        result = self._record(
            f"check:{component}", self.transport.run(list(steps.check), timeout_s=steps.check_timeout_s)
        )
        if result.exit_code != 0 or result.timed_out:
            return None
        measured = result.output_tail.strip()
        if len(measured) <= MAX_VERSION:  # longer is no version (an error message): the failure says it
            self._state["versions"][component] = measured
        return measured

    def _expect(self, component: str, steps: ComponentSteps, version: str, when: str) -> None:
        measured = self._check(component, steps)
        if measured != version:
            last = self._state["steps"][-1]
            raise _Failed(
                f"{when}, the check of {component} says {measured!r}, not {version!r}"
                + ("" if measured is not None else f" (exit {last['exit_code']}: {last['output_tail'].strip()[-200:]})")
            )

    # -- plumbing ---------------------------------------------------------------------------------
    def _command(self, name: str, command: Command, *, fail: bool = True) -> CommandResult:
        result = self._record(name, self.transport.run(list(command.argv), timeout_s=command.timeout_s))
        if fail and (result.exit_code != 0 or result.timed_out):
            raise _Failed(f"{name} failed: {_summary(result)}")
        return result

    def _record(self, name: str, result: CommandResult) -> CommandResult:
        if "\x00" in result.output_tail:  # the one way a NUL (binary output) gets into a report
            result = result._replace(output_tail=result.output_tail.replace("\x00", "\ufffd"))
        step = _step(name, result, self._state["attempt"])
        self._state["steps"].append(step)
        self._save()
        if self.on_step:
            self.on_step(step)
        return result

    def _result(self) -> dict[str, Any]:
        return {"versions": dict(self._state["versions"]), "steps": list(self._state["steps"][-20:])}

    def _save(self) -> None:
        self.store.save(self._state["item"]["id"], self._state)


def _summary(result: CommandResult) -> str:
    if result.timed_out:
        head = f"timed out after {result.duration_s:.0f}s"
    elif result.exit_code is None:
        head = "did not run"
    else:
        head = f"exit {result.exit_code}"
    tail = result.output_tail.strip()[-300:]
    return f"{head}; output: {tail}" if tail else head


# -- a transport for the host we run on ---------------------------------------------------------------


class LocalTransport:
    """Runs commands on this host (the agent): output to a log file per command under `log_dir`
    (the newest `keep_logs` kept), the tail read back from it; the process group is killed at the
    timeout. The boot id comes from `boot_id_file` (the kernel's by default).

    A command runs in a session of its own, so it outlives a crash of the agent: `running_file`
    records it (RunningRecord), and after a restart the next command waits for it: an install never
    runs beside an older one."""

    def __init__(
        self,
        *,
        log_dir: Path,
        boot_id_file: str = DEFAULT_BOOT_ID_FILE,
        keep_logs: int = 200,
        tail_bytes: int = TAIL_BYTES,
        running_file: Path | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.boot_id_file, self.keep_logs, self.tail_bytes = boot_id_file, keep_logs, tail_bytes
        self.running = RunningRecord(running_file)
        self._seq = 0

    def run(self, argv: list[str], *, timeout_s: float) -> CommandResult:
        self.running.wait_for_leftover(running=lambda tag: bool(_tagged_processes(tag)), kill=_kill_tagged)
        tag = self.running.remember(argv, timeout_s=timeout_s)
        try:
            return self._run(argv, timeout_s=timeout_s, env={**os.environ, TAG_VARIABLE: tag})
        finally:
            self.running.forget()  # it ended (or never started); a crash leaves the record

    def _run(self, argv: list[str], *, timeout_s: float, env: Mapping[str, str]) -> CommandResult:
        self._seq += 1
        log = (
            self.log_dir
            / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{self._seq:04d}-{Path(argv[0]).name[:40]}.log"
        )
        started = time.monotonic()
        with log.open("wb") as sink:
            sink.write(f"$ {' '.join(argv)}\n".encode())
            sink.flush()
            header = sink.tell()
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                )
            except OSError as error:
                sink.write(f"cannot start: {error}\n".encode())
                return CommandResult(None, f"cannot start {argv[0]}: {error}", time.monotonic() - started, False)
            timed_out = False
            try:
                code: int | None = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process)
                code = None
        duration = time.monotonic() - started
        tail = _tail(log, header, self.tail_bytes)
        self._prune()  # after reading the tail: with keep_logs = 0 this log goes too
        return CommandResult(code, tail, duration, timed_out)

    def boot_id(self) -> str:
        return Path(self.boot_id_file).read_text().strip()

    def reboot(self, argv: list[str]) -> None:
        """Ask for the reboot; it returns at once and the host goes down (and takes us with it)."""
        result = self.run(argv, timeout_s=120)
        if result.exit_code not in (0, None) or result.timed_out:
            raise RuntimeError(f"the reboot command {' '.join(argv)} failed: {_summary(result)}")

    def _prune(self) -> None:
        logs = sorted(self.log_dir.glob("*.log"))
        for old in logs[: max(0, len(logs) - self.keep_logs)]:
            old.unlink(missing_ok=True)


def _tagged_processes(tag: str) -> list[int]:
    """The processes on this host whose environment carries the command's tag."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


def _kill_tagged(tag: str) -> None:
    for pid in _tagged_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 9)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, 9)
    process.wait()


def _tail(log: Path, start: int, limit: int) -> str:
    with log.open("rb") as source:
        size = source.seek(0, os.SEEK_END)
        source.seek(max(start, size - limit))
        return source.read().decode("utf-8", errors="replace")
