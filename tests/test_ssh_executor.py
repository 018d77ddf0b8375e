"""The SSH executor (issue 22): the step protocol run from a central worker over SSH, against a real
OpenSSH server on loopback (tests/sshd.py) and, for whole upgrades, the real web server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from knox.models import AuthToken
from opsplanner_adapters.ssh import HostKeyRejected, SshError, SshHost, SshOptions, SshTransport

from fleet import services as fleet_services
from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import HostTask, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.browser import LiveServer, live_server_process  # noqa: F401 (a fixture)
from tests.builders import _catalogue
from tests.driving import instant_simulator
from tests.processes import ROOT, free_port, wait_for
from tests.sshd import Sshd, running_sshd
from tests.trains_builders import make_user


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def _transport(server: Sshd, **options: object) -> SshTransport:
    host = SshHost(name="gpu-1", address=server.address, port=server.port, user=server.user, key_file=server.client_key)
    known_hosts = options.pop("known_hosts", server.known_hosts)
    return SshTransport(host, SshOptions(known_hosts=known_hosts, **options))  # type: ignore[arg-type]


def test_a_command_on_the_host_reports_its_exit_code_and_its_output_and_errors_together(sshd: Sshd) -> None:
    transport = _transport(sshd)
    try:
        result = transport.run(["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"], timeout_s=10)
    finally:
        transport.close()
    assert result.exit_code == 3
    assert not result.timed_out
    assert "to-stdout" in result.output_tail
    assert "to-stderr" in result.output_tail
    assert result.duration_s < 10


def test_arguments_reach_the_host_as_given_without_a_shell_reading_them(sshd: Sshd, tmp_path: Path) -> None:
    transport = _transport(sshd)
    try:
        result = transport.run(["printf", "%s|", "a b", "$HOME", "'q'", ";rm"], timeout_s=10)
    finally:
        transport.close()
    assert result.output_tail == "a b|$HOME|'q'|;rm|"


@pytest.mark.slow
def test_a_command_past_its_timeout_is_killed_on_the_host_with_its_children_even_in_their_own_session(
    sshd: Sshd, tmp_path: Path
) -> None:
    marker = tmp_path / "survived"
    transport = _transport(sshd)
    try:
        result = transport.run(["sh", "-c", f"echo begun; setsid sh -c 'sleep 3; touch {marker}' & wait"], timeout_s=1)
        assert result.timed_out
        assert result.exit_code is None
        assert "begun" in result.output_tail
        assert result.duration_s < 3
        time.sleep(3.5 - result.duration_s)
        assert not marker.exists(), "the timed-out command (or its child) kept running on the host"
        # The same connection runs the next command.
        assert transport.run(["true"], timeout_s=5).exit_code == 0
    finally:
        transport.close()


def test_the_output_kept_is_the_bounded_tail(sshd: Sshd) -> None:
    transport = _transport(sshd, output_tail_bytes=100)
    try:
        result = transport.run(["seq", "1", "200000"], timeout_s=20)
    finally:
        transport.close()
    assert result.exit_code == 0
    assert len(result.output_tail) <= 100
    assert result.output_tail.endswith("199999\n200000\n")


def test_a_host_key_that_does_not_match_known_hosts_is_refused_and_nothing_runs(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    transport = _transport(sshd, known_hosts=sshd.other_known_hosts(tmp_path))
    with pytest.raises(HostKeyRejected, match=r"host key of gpu-1 .* does not match .*known_hosts_changed"):
        transport.run(["touch", str(marker)], timeout_s=5)
    assert not marker.exists()


def test_a_host_missing_from_known_hosts_is_refused_not_learned(sshd: Sshd, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts_empty"
    known_hosts.write_text("")
    transport = _transport(sshd, known_hosts=known_hosts)
    with pytest.raises(HostKeyRejected, match=r"not in .*known_hosts_empty; refusing an unknown host key"):
        transport.run(["true"], timeout_s=5)
    assert known_hosts.read_text() == ""


def test_a_key_the_host_does_not_accept_is_a_clear_login_failure(sshd: Sshd, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    host = SshHost(name="gpu-1", address=sshd.address, port=sshd.port, user=sshd.user, key_file=stranger)
    transport = SshTransport(host, SshOptions(known_hosts=sshd.known_hosts))
    with pytest.raises(SshError, match=r"cannot log in to gpu-1 \(root@127.0.0.1:\d+\): Authentication failed"):
        transport.run(["true"], timeout_s=5)


def test_a_reboot_waits_for_the_host_to_answer_with_a_new_boot_id(sshd: Sshd, tmp_path: Path) -> None:
    boot_file = tmp_path / "boot_id"
    boot_file.write_text("boot-1\n")
    transport = _transport(sshd, boot_id_argv=("cat", str(boot_file)), reboot_poll_s=0.2, reboot_timeout_s=15)
    # The fake reboot: a new boot id a moment after the command returns, as a host comes back.
    reboot = ["sh", "-c", f"(sleep 0.5; echo boot-2 > {boot_file}) >/dev/null 2>&1 &"]
    # A reboot that takes the connection down under the command: the session's sshd is killed.
    dropping = ["sh", "-c", f"echo boot-3 > {boot_file}; kill -KILL $PPID"]
    try:
        assert transport.boot_id() == "boot-1"
        transport.reboot(reboot)
        assert transport.boot_id() == "boot-2"
        transport.reboot(dropping)
        assert transport.boot_id() == "boot-3"
    finally:
        transport.close()


def test_a_reboot_that_never_brings_a_new_boot_id_fails_with_the_reason(sshd: Sshd, tmp_path: Path) -> None:
    boot_file = tmp_path / "boot_id"
    boot_file.write_text("boot-1\n")
    transport = _transport(sshd, boot_id_argv=("cat", str(boot_file)), reboot_timeout_s=1, reboot_poll_s=0.2)
    with pytest.raises(SshError, match="did not come back with a new boot id within 1s"):
        transport.reboot(["true"])
    with pytest.raises(SshError, match=r"the reboot command false on gpu-1 .* exited 1"):
        transport.reboot(["false"])


# -- the executor as a process, against the real web server ---------------------------------------------

DRIVER_FROM, DRIVER_TO = "550.127.05", "560.35.03"
# The web server and the executor are other processes: what they should see must be committed.
end_to_end = pytest.mark.django_db(transaction=True)


@dataclass
class FakeHost:
    """A host's files on loopback: the driver version its check reads, the installs it counted, and
    the boot id its reboot command rewrites (the fake reboot)."""

    name: str
    folder: Path

    @property
    def installs(self) -> int:
        path = self.folder / "installs"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def boot_id(self) -> str:
        return (self.folder / "boot_id").read_text().strip()


@dataclass
class ExecutorProcess:
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def fake_host(tmp_path: Path, name: str) -> FakeHost:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "driver").write_text(f"{DRIVER_FROM}\n")
    (folder / "boot_id").write_text("boot-before\n")
    return FakeHost(name, folder)


def write_config(
    path: Path, *, url: str, token: str, server: Sshd, host: FakeHost, install: str, check: str, known_hosts: Path
) -> Path:
    """The executor's TOML: one host on the test sshd, the gpu-driver steps as shell snippets run
    in the host's folder, verifications that pass, and the fake reboot."""
    folder = host.folder
    path.write_text(
        f"""
[api]
url = "{url}"
token = "{token}"
worker = "ssh-under-test"

[executor]
state_dir = "{path.parent / "state"}"
concurrency = 2
lease_seconds = 4
wait_seconds = 1

[ssh]
known_hosts = "{known_hosts}"
key_file = "{server.client_key}"
user = "{server.user}"
boot_id_command = ["cat", "{folder}/boot_id"]
reboot_poll_s = 0.2

[hosts."{host.name}"]
address = "{server.address}"
port = {server.port}

[steps]
reboot = ["sh", "-c", "cat /proc/sys/kernel/random/uuid > {folder}/boot_id"]

[steps.components.gpu-driver]
install = ["sh", "-c", "cd {folder} && echo {{version}} >> installs && {install}"]
check = ["sh", "-c", "cd {folder} && {check}"]
timeout_s = 30

[steps.verify.health]
command = ["true"]
[steps.verify.burn_in]
command = ["true"]
[steps.verify.collective]
command = ["true"]
"""
    )
    return path


def spawn(config: Path, log: Path) -> ExecutorProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}
    with log.open("ab") as sink:
        command = [sys.executable, "-m", "opsplanner_adapters.ssh_executor", "--config", str(config)]
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return ExecutorProcess(process, log)


@dataclass
class Rig:
    """One pool whose executor is "ssh", one host on the test sshd, and a way to start executors."""

    pool: Pool
    host: FakeHost
    start: Callable[..., ExecutorProcess]

    def upgrade(self) -> HostTask:
        operation = operation_submit(
            kind="upgrade",
            component="gpu-driver",
            version=DRIVER_TO,
            scope=f"hosts: {self.host.name}",
            reason="driver rollout",
        )
        return operation.tasks.get()


@pytest.fixture
def rig(live_server_process: LiveServer, sshd: Sshd, tmp_path: Path) -> Iterator[Rig]:  # noqa: F811
    instant_simulator()
    catalogue = _catalogue()
    pool = fleet_services.pool_create(
        name="ssh-pool", workload_class="ai_training", planned_buffer_hosts=1, failure_buffer_hosts=1, executor="ssh"
    )
    domain = fleet_services.domain_create(pool=pool, name="rack-1", position=1)
    host = fake_host(tmp_path, "gpu-7.ssh.test")
    row = fleet_services.host_create(hostname=host.name, domain=domain, sku="gpu-h100-8x", gpu_count=8)
    for component, version in (("cuda-runtime", "12.4.1"), ("gpu-driver", DRIVER_FROM)):
        fleet_services.installed_version_set(host=row, version=catalogue[component][version])
    _, token = AuthToken.objects.create(make_user(Role.EXECUTOR))
    started: list[ExecutorProcess] = []

    def start(*, install: str, check: str = "cat driver", known_hosts: Path | None = None) -> ExecutorProcess:
        config = write_config(
            tmp_path / "executor.toml",
            url=live_server_process.url,
            token=token,
            server=sshd,
            host=host,
            install=install,
            check=check,
            known_hosts=known_hosts or sshd.known_hosts,
        )
        started.append(spawn(config, tmp_path / f"executor-{len(started)}.log"))
        return started[-1]

    yield Rig(pool, host, start)
    for executor in started:
        executor.stop()
    (host.folder / "release").touch()  # ends an install a killed executor left waiting on the host


def drive_until(rig: Rig, condition: Callable[[], object], *, what: str, timeout: float = 45) -> None:
    """Tick the pool and run the simulated drainer until the condition holds; the executor, a
    separate process, runs the steps over SSH meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            items = list(WorkItem.objects.filter(pool_id=rig.pool.pk).values_list("kind", "state", "outcome_reason"))
            logs = "\n".join(path.read_text()[-3000:] for path in sorted(rig.host.folder.parent.glob("executor-*.log")))
            raise AssertionError(f"timed out waiting for {what}; items: {items}\nexecutor:\n{logs}")
        pool_tick(pool_id=rig.pool.pk, kick=False)
        simulated_work_step()
        time.sleep(0.2)


def execute_item(task: HostTask) -> WorkItem:
    return WorkItem.objects.get(host_task=task, kind=WorkKind.EXECUTE)


def execute_state(task: HostTask) -> str | None:
    return WorkItem.objects.filter(host_task=task, kind=WorkKind.EXECUTE).values_list("state", flat=True).first()


def task_state(task: HostTask) -> str:
    return HostTask.objects.get(pk=task.pk).state


@pytest.mark.slow
@end_to_end
def test_an_upgrade_whose_install_asks_for_a_reboot_finishes_after_the_new_boot_without_installing_again(
    rig: Rig,
) -> None:
    # The install writes the new version, then asks for a reboot (exit 194).
    executor = rig.start(install="echo {version} > driver && exit 194")
    task = rig.upgrade()
    drive_until(rig, lambda: task_state(task) == TaskState.DONE, what="the upgrade to finish")
    item = execute_item(task)
    assert (item.state, item.adapter, item.attempts) == (WorkState.DONE, "ssh", 1)
    assert rig.host.installs == 1
    assert rig.host.boot_id() != "boot-before"
    names = [step["name"] for step in item.result["steps"]]
    assert names == ["check:gpu-driver", "install:gpu-driver", "reboot", "check:gpu-driver"]
    assert item.result["versions"] == {"gpu-driver": DRIVER_TO}
    verifications = WorkItem.objects.filter(host_task__host__hostname=rig.host.name, kind=WorkKind.VERIFY)
    assert {(v.adapter, v.state, v.result["passed"]) for v in verifications} == {("ssh", WorkState.DONE, True)}
    host = Host.objects.get(hostname=rig.host.name)
    assert host.state == HostState.IN_SERVICE
    assert InstalledVersion.objects.get(host=host, component__name="gpu-driver").version.version == DRIVER_TO
    assert executor.process.poll() is None


# Installs that run on the host until the test releases them. The first one's work is done (it
# writes the version) or lost (it fails); a second install always does the work.
INSTALL_DONE = "while [ ! -e release ]; do sleep 0.1; done && echo {version} > driver"
INSTALL_LOST = (
    "n=$(wc -l < installs); while [ ! -e release ]; do sleep 0.1; done; [ $n -gt 1 ] && echo {version} > driver"
)


@pytest.mark.slow
@end_to_end
@pytest.mark.parametrize(
    ("install", "installs", "attempts", "reported"),
    [
        (INSTALL_DONE, 1, 1, [("check:gpu-driver", 1), ("check:gpu-driver", 1)]),
        (INSTALL_LOST, 2, 2, [("check:gpu-driver", 2), ("install:gpu-driver", 2), ("check:gpu-driver", 2)]),
    ],
    ids=["the-left-install-did-the-work", "the-left-install-failed"],
)
def test_an_executor_killed_mid_install_and_restarted_waits_for_it_then_the_check_decides_on_one_more_install(
    rig: Rig, install: str, installs: int, attempts: int, reported: list[tuple[str, int]]
) -> None:
    first = rig.start(install=install)
    task = rig.upgrade()
    drive_until(rig, lambda: rig.host.installs == 1, what="the install to start")
    first.stop(signal.SIGKILL)  # the install is not its child: it goes on running on the host
    second = rig.start(install=install)
    # The restarted executor resumes the item it still holds and waits for the install it left
    # running: never a second install beside the first.
    drive_until(rig, lambda: "from before a restart; waiting for it" in second.output(), what="the wait")
    assert "resuming item" in second.output()
    time.sleep(1)
    assert rig.host.installs == 1
    (rig.host.folder / "release").touch()
    drive_until(rig, lambda: execute_state(task) == WorkState.DONE, what="the install to be reported")
    item = execute_item(task)
    assert (item.state, item.attempts, rig.host.installs) == (WorkState.DONE, attempts, installs)
    # What the reporting attempt ran: the check found the new version, or found the old one and
    # the install ran once more (the interrupted attempt gave its claim up rather than install again).
    assert [(s["name"], s["attempt"]) for s in item.result["steps"]] == reported
    assert item.result["versions"] == {"gpu-driver": DRIVER_TO}


@pytest.mark.slow
@end_to_end
def test_a_failing_check_fails_the_item_with_its_output_tail_and_sends_the_host_to_repair(rig: Rig) -> None:
    executor = rig.start(install="true", check="echo 'bios-version: cannot read the SMBIOS table' && exit 3")
    task = rig.upgrade()
    drive_until(rig, lambda: execute_state(task) == WorkState.FAILED, what="the execute item to fail")
    executor.stop()
    drive_until(rig, lambda: task_state(task) == TaskState.FAILED, what="the task to fail")
    item = execute_item(task)
    assert "cannot read the SMBIOS table" in item.outcome_reason
    last = item.result["steps"][-1]
    assert (last["name"], last["exit_code"]) == ("check:gpu-driver", 3)
    assert "bios-version: cannot read the SMBIOS table" in last["output_tail"]
    assert rig.host.installs == 1
    assert Host.objects.get(hostname=rig.host.name).state == HostState.REPAIR


@pytest.mark.slow
@end_to_end
def test_a_host_key_that_does_not_match_fails_the_item_with_the_reason_and_runs_nothing(
    rig: Rig, sshd: Sshd, tmp_path: Path
) -> None:
    rig.start(install="true", check="touch checked && cat driver", known_hosts=sshd.other_known_hosts(tmp_path))
    task = rig.upgrade()
    drive_until(rig, lambda: execute_state(task) == WorkState.FAILED, what="the execute item to fail")
    item = execute_item(task)
    assert f"the host key of {rig.host.name}" in item.outcome_reason
    assert "does not match" in item.outcome_reason
    assert item.attempts == 1
    assert not (rig.host.folder / "checked").exists()
    assert rig.host.installs == 0


VALID = """
[api]
url = "http://127.0.0.1:9"
token = "t"
[executor]
state_dir = "state"
[ssh]
known_hosts = "known_hosts"
key_file = "key"
[hosts.gpu-1]
address = "127.0.0.1"
[steps.components.gpu-driver]
install = ["true"]
check = ["true"]
"""


BAD_CONFIGS = {
    "host-without-address": (('address = "127.0.0.1"', "port = 22"), "[hosts.gpu-1]: `address` is required"),
    "missing-known-hosts": (('"known_hosts"', '"missing"'), "[ssh]: the known_hosts file {dir}/missing does not exist"),
    "install-not-a-list": (('install = ["true"]', 'install = "true"'), "gpu-driver.install must be a non-empty list"),
    "no-threads": (("[executor]", "[executor]\nconcurrency = 0"), "[executor]: `concurrency` must be 1 to 256, not 0"),
    "bad-toml": (("[hosts.gpu-1]", "[hosts.gpu-1"), "is not valid TOML"),
}


@pytest.mark.parametrize(("change", "message"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_a_configuration_error_is_one_clear_line_and_no_traceback(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    (tmp_path / "known_hosts").write_text("")
    (tmp_path / "key").write_text("")
    config = tmp_path / "executor.toml"
    config.write_text(VALID.replace(*change))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}
    command = [sys.executable, "-m", "opsplanner_adapters.ssh_executor", "--config", str(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"opsplanner-ssh-executor: {config}: ")
    assert message.format(dir=tmp_path) in lines[0]


@pytest.mark.slow
def test_an_unreachable_api_makes_the_executor_back_off_and_keep_running(tmp_path: Path) -> None:
    (tmp_path / "known_hosts").write_text("")
    (tmp_path / "key").write_text("")
    config = tmp_path / "executor.toml"
    closed = free_port()  # nothing listens there
    text = VALID.replace("http://127.0.0.1:9", f"http://127.0.0.1:{closed}")
    config.write_text(text.replace("[executor]", "[executor]\nconcurrency = 1"))
    executor = spawn(config, tmp_path / "executor.log")
    try:
        pattern = re.compile(r"the API is unreachable .*; trying again in (\d+\.\d)s")
        wait_for(lambda: len(pattern.findall(executor.output())) >= 3, timeout=20, what="three retries")
        delays = [float(d) for d in pattern.findall(executor.output())[:3]]
        assert delays[0] < delays[2], f"no back-off: {delays}"
        assert executor.process.poll() is None
    finally:
        executor.stop()
    assert executor.process.returncode == 0
