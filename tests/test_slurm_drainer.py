"""The Slurm drainer against a real Slurm cluster: real slurmctld/slurmd, real jobs, the real web
server, and `opsplanner-slurm-drainer` as its own process claiming through the API. The ticks and
the simulated executor run in this process (the upgrade step itself is simulated here)."""

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

from fleet import services as fleet_services
from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import HostTask, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.models.operations import FailureCode
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.agent_helpers import FakeHost, start_agent, toml_document
from tests.browser import LiveServer, live_server_process  # noqa: F401 (a fixture)
from tests.builders import _catalogue
from tests.driving import instant_simulator
from tests.processes import ROOT, free_port, wait_for
from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)
from tests.trains_builders import make_train, make_user
from trains.models import Upgrade, UpgradeState
from trains.services.tick import trains_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.slow
# The web server and the drainer are other processes: what they should see must be committed.
on_the_cluster = pytest.mark.django_db(transaction=True)

DOMAIN = "slurm.test"


@dataclass
class DrainerProcess:
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def write_config(path: Path, *, url: str, token: str, conf: Path, margin_s: float = 2) -> Path:
    path.write_text(
        f'[api]\nurl = "{url}"\ntoken = "{token}"\nworker = "drainer-under-test"\n\n'
        f'[slurm]\nconf = "{conf}"\npoll_interval_s = 0.5\nlease_s = 3\ndeadline_margin_s = {margin_s}\n\n'
        '[nodes]\npattern = "{short}"\n'
    )
    return path


def spawn(config: Path, log: Path) -> DrainerProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}
    with log.open("ab") as sink:
        command = [sys.executable, "-m", "opsplanner_adapters.slurm_drainer", "--config", str(config)]
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return DrainerProcess(process=process, log=log)


@pytest.fixture
def token() -> str:
    """An executor's token, made per test: the database is emptied between tests."""
    return AuthToken.objects.create(make_user(Role.EXECUTOR))[1]


@pytest.fixture
def start_drainer(
    live_server_process: LiveServer,  # noqa: F811
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
    token: str,
) -> Iterator[Callable[[], DrainerProcess]]:
    """Start drainer processes (several in a test: one may be killed and another started)."""
    config = write_config(tmp_path / "drainer.toml", url=live_server_process.url, token=token, conf=slurm_cluster.conf)
    started: list[DrainerProcess] = []

    def start() -> DrainerProcess:
        started.append(spawn(config, tmp_path / f"drainer-{len(started)}.log"))
        return started[-1]

    yield start
    for drainer in started:
        drainer.stop()
    for node in slurm_cluster.nodes:  # the next test finds every node idle, whatever this one did
        slurm_cluster.reset(node)


@pytest.fixture
def pool(slurm_cluster: SlurmCluster) -> Pool:  # noqa: F811
    """A pool whose drainer is Slurm (the executor simulated), with the hosts of nodes n3 and n4, and
    of n9, which Slurm does not know."""
    return slurm_pool("slurm-pool", nodes=("n3", "n4", "n9"), executor="simulated")


def slurm_pool(name: str, *, nodes: tuple[str, ...], executor: str) -> Pool:
    """One host per node (`n2.slurm.test` is node n2), running driver 550, drained by Slurm."""
    instant_simulator()
    catalogue = _catalogue()
    pool = fleet_services.pool_create(
        name=name,
        workload_class="ai_training",
        planned_buffer_hosts=len(nodes),
        failure_buffer_hosts=len(nodes),
        drainer="slurm",
        executor=executor,
    )
    domain = fleet_services.domain_create(pool=pool, name="rack-1", position=1)
    for node in nodes:
        host = fleet_services.host_create(hostname=f"{node}.{DOMAIN}", domain=domain, sku="gpu-h100-8x", gpu_count=8)
        for component, version in (("cuda-runtime", "12.4.1"), ("gpu-driver", "550.127.05"), ("bios", "2.14.0")):
            fleet_services.installed_version_set(host=host, version=catalogue[component][version])
    return pool


@pytest.fixture
def agent_on_n2(live_server_process: LiveServer, token: str, tmp_path: Path) -> Iterator[FakeHost]:  # noqa: F811
    """The host agent of n2.slurm.test as its own process, over scripts standing for the driver installer."""
    host = FakeHost.make(tmp_path / "n2-host", version="550.127.05")
    steps = host.steps()
    steps["components"] = {"gpu-driver": steps["components"]["gpu_driver"]}
    health = steps["verify"]["health"]
    steps["verify"].update({"burn_in": health, "collective": health})
    config = tmp_path / "agent" / "agent.toml"
    config.parent.mkdir()
    document = {
        "api": {"url": live_server_process.url, "token": token, "timeout_s": 10},
        "agent": {
            "hostname": f"n2.{DOMAIN}",
            "state_dir": str(config.parent / "state"),
            "log_dir": str(config.parent / "logs"),
            "lease_seconds": 30,
            "heartbeat_seconds": 1,
            "wait_seconds": 1,
            "boot_id_file": str(host.root / "boot_id"),
        },
        "steps": steps,
    }
    config.write_text(toml_document(document))
    process = start_agent(config, tmp_path / "agent.log")
    yield host
    process.terminate()
    process.wait(timeout=20)


def upgrade(node: str, **fields: object) -> HostTask:
    operation = operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        scope=f"hosts: {node}.{DOMAIN}",
        reason="driver rollout",
        **fields,  # type: ignore[arg-type]
    )
    return operation.tasks.get()


def item(task: HostTask, kind: str) -> WorkItem | None:
    return WorkItem.objects.filter(host_task=task, kind=kind).first()


def drive_until(
    pool: Pool,
    condition: Callable[[], object],
    *,
    what: str,
    timeout: float = 60,
    drainers: tuple[DrainerProcess, ...] = (),
    each: Callable[[], None] | None = None,
    trains: bool = False,
) -> None:
    """Tick the pool (and the trains) and run the simulated executor until the condition holds (the
    drainer and the agent, separate processes, do their parts meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        if trains:
            trains_tick()
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
        if each:
            each()
        if condition():
            return
        if time.monotonic() > deadline:
            items = list(WorkItem.objects.filter(pool_id=pool.pk).values_list("kind", "state", "outcome_reason"))
            logs = "\n".join(d.output()[-2000:] for d in drainers)
            raise AssertionError(f"timed out waiting for {what}; items: {items}\ndrainer:\n{logs}")
        time.sleep(0.3)


def installed_driver(node: str) -> str:
    return InstalledVersion.objects.get(host__hostname=f"{node}.{DOMAIN}", component__name="gpu-driver").version.version


@on_the_cluster
def test_a_train_drains_a_busy_node_after_its_job_upgrades_it_through_the_agent_and_resumes_it(
    slurm_cluster: SlurmCluster,  # noqa: F811
    start_drainer: Callable[[], DrainerProcess],
    agent_on_n2: FakeHost,
) -> None:
    cluster = slurm_cluster
    pool = slurm_pool("train-pool", nodes=("n2",), executor="agent")
    make_train(pool)
    upgrade_row = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver rollout")
    job = cluster.sbatch("n2", 10, name="train-llm")
    first = start_drainer()
    drive_until(pool, lambda: cluster.state("n2") == "draining", what="n2 to drain", drainers=(first,), trains=True)
    task = HostTask.objects.get(host__hostname=f"n2.{DOMAIN}")
    drain = item(task, WorkKind.DRAIN)
    assert drain is not None
    assert (drain.state, drain.adapter) == (WorkState.RUNNING, "slurm")
    reason = cluster.reason("n2")
    assert reason == f"opsplanner: operation {task.operation_id} item {drain.pk}"

    # The drainer dies mid-drain; its lease runs out and a new one takes the item back without
    # draining again (the node already carries our reason).
    first.stop(signal.SIGKILL)
    second = start_drainer()
    drive_until(
        pool,
        lambda: "already drained by us" in second.output(),
        what="the redelivered drain",
        drainers=(second,),
        trains=True,
    )

    def drain_waits_for_the_job() -> None:
        if cluster.job_state(job) == "RUNNING":
            assert item(task, WorkKind.DRAIN).state != WorkState.DONE, "the drain finished while the job ran"

    drive_until(
        pool,
        lambda: HostTask.objects.get(pk=task.pk).state == TaskState.DONE,
        what="the upgrade to finish",
        drainers=(second,),
        each=drain_waits_for_the_job,
        trains=True,
    )
    drain.refresh_from_db()
    assert (drain.state, drain.attempts, cluster.job_state(job)) == (WorkState.DONE, 2, "")
    # The agent ran the installer once, and its check measured the version the tick recorded.
    assert (agent_on_n2.installs(), agent_on_n2.read("version")) == (["560.35.03"], "560.35.03")
    assert installed_driver("n2") == "560.35.03"
    assert item(task, WorkKind.EXECUTE).adapter == "agent"
    undrain = item(task, WorkKind.UNDRAIN)
    assert (undrain.state, undrain.adapter) == (WorkState.DONE, "slurm")
    assert Host.objects.get(hostname=f"n2.{DOMAIN}").state == HostState.IN_SERVICE
    assert (cluster.state("n2"), cluster.reason("n2")) == ("idle", "")
    cluster.sbatch("n2", 1, name="after-upgrade")  # fails unless the job runs on n2
    drive_until(
        pool,
        lambda: Upgrade.objects.get(pk=upgrade_row.pk).state == UpgradeState.COMPLETED,
        what="the upgrade to complete",
        trains=True,
    )


@on_the_cluster
def test_a_drain_past_its_deadline_fails_naming_the_job_and_the_node_is_given_back(
    pool: Pool,
    slurm_cluster: SlurmCluster,  # noqa: F811
    start_drainer: Callable[[], DrainerProcess],
) -> None:
    cluster = slurm_cluster
    job = cluster.sbatch("n3", 300, name="long-eval")
    drainer = start_drainer()
    task = upgrade("n3", drain_timeout_s=8)
    drive_until(
        pool,
        lambda: HostTask.objects.get(pk=task.pk).state == TaskState.FAILED,
        what="the drain to fail",
        drainers=(drainer,),
    )
    task.refresh_from_db()
    assert task.failure_code == FailureCode.DRAIN_FAILED
    assert f"still runs 1 job at the drain deadline: {job} long-eval (root)" in task.failure_reason
    assert f"{job} long-eval (root)" in item(task, WorkKind.DRAIN).outcome_reason
    # The undrain that follows resumes our drain: the node goes on running its job.
    drive_until(
        pool,
        lambda: Host.objects.get(hostname=f"n3.{DOMAIN}").state == HostState.IN_SERVICE,
        what="n3 back in service",
        drainers=(drainer,),
    )
    assert item(task, WorkKind.UNDRAIN).state == WorkState.DONE
    assert (cluster.state("n3"), cluster.reason("n3"), cluster.job_state(job)) == ("allocated", "", "RUNNING")
    assert installed_driver("n3") == "550.127.05"


@on_the_cluster
def test_a_node_drained_by_someone_else_is_never_resumed(
    pool: Pool,
    slurm_cluster: SlurmCluster,  # noqa: F811
    start_drainer: Callable[[], DrainerProcess],
) -> None:
    cluster = slurm_cluster
    cluster.run("scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=hardware: dimm")
    drainer = start_drainer()
    task = upgrade("n4")
    drive_until(
        pool,
        lambda: (u := item(task, WorkKind.UNDRAIN)) is not None and u.state == WorkState.FAILED,
        what="the undrain to be refused",
        drainers=(drainer,),
    )
    assert item(task, WorkKind.DRAIN).state == WorkState.DONE
    assert "drained by someone else (reason: 'hardware: dimm')" in item(task, WorkKind.UNDRAIN).outcome_reason
    assert installed_driver("n4") == "560.35.03"
    assert (cluster.state("n4"), cluster.reason("n4")) == ("drained", "hardware: dimm")
    drive_until(
        pool,
        lambda: Host.objects.get(hostname=f"n4.{DOMAIN}").state != HostState.RETURNING,
        what="the refused return to be acted on",
    )
    # The host is not counted in service while Slurm keeps it out: it fails its return, with the reason.
    assert Host.objects.get(hostname=f"n4.{DOMAIN}").state in (HostState.FAILED, HostState.REPAIR)
    task.refresh_from_db()
    assert task.failure_code == FailureCode.RETURN_FAILED
    assert "hardware: dimm" in task.failure_reason
    assert (cluster.state("n4"), cluster.reason("n4")) == ("drained", "hardware: dimm")


@on_the_cluster
def test_a_host_that_is_no_slurm_node_fails_its_drain_at_once_saying_so(
    pool: Pool, start_drainer: Callable[[], DrainerProcess]
) -> None:
    drainer = start_drainer()
    task = upgrade("n9")
    drive_until(
        pool,
        lambda: HostTask.objects.get(pk=task.pk).state == TaskState.FAILED,
        what="the drain to fail",
        drainers=(drainer,),
        timeout=20,
    )
    assert (
        "Slurm node n9 (host n9.slurm.test): Slurm has no node named 'n9'" in item(task, WorkKind.DRAIN).outcome_reason
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('[api]\nurl = "http://127.0.0.1:9"\n', "api.token (or api.token_file) is required"),
        ('[api]\nurl = "ftp://x"\ntoken = "t"\n', "api.url must be an http:// or https:// URL"),
        (
            '[api]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n[slurm]\npoll_interval_s = "fast"\n',
            "slurm.poll_interval_s",
        ),
        ('[api]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n[nodes]\npattern = "{rack}"\n', "nodes.pattern"),
        ("[api\n", "is not valid TOML"),
    ],
)
def test_a_bad_configuration_is_one_clear_line(tmp_path: Path, config: str, message: str) -> None:
    path = tmp_path / "drainer.toml"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "opsplanner_adapters.slurm_drainer", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_unreachable_api_is_retried_with_growing_waits_and_the_drainer_keeps_running(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = write_config(tmp_path / "drainer.toml", url=nobody, token="t", conf=slurm_cluster.conf)
    drainer = spawn(config, tmp_path / "drainer.log")
    try:
        wait_for(lambda: drainer.output().count("API unreachable") >= 4, timeout=20, what="four retries")
        assert drainer.process.poll() is None
    finally:
        drainer.stop()
    waits = [float(w) for w in re.findall(r"next try in ([0-9.]+)s", drainer.output())]
    assert waits[:4] == sorted(waits[:4])
    assert waits[3] > 2 * waits[0]
    assert "Traceback" not in drainer.output()
