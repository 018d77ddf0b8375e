"""A real Slurm cluster for tests: munged, slurmctld and several slurmd nodes on this one machine.

Everything lives in a temporary folder on free ports (see `../shared/notes/slurm-local-cluster.md`):
several `slurmd -N <node>` on one host work because the plugins use no cgroups. `SLURM_CONF` is
exported to this process's environment so every subprocess (sbatch, the drainer) finds the cluster.
One cluster per test session; teardown cancels the jobs, stops the daemons and kills leftover
`slurmstepd` (they outlive a stopped slurmd)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import free_port, wait_for

NODES = ("n1", "n2", "n3", "n4")
PARTITION = "main"


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: tuple[str, ...]
    env: dict[str, str]

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").strip()

    def reason(self, node: str) -> str:
        reason = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%E").strip()
        return "" if reason == "none" else reason

    def sbatch(self, node: str, seconds: int, name: str = "sleeper") -> str:
        """Submit `sleep` on that node and wait until it runs; its job id."""
        out = self.run("sbatch", "--parsable", "-J", name, "-w", node, "-o", "/dev/null", "--wrap", f"sleep {seconds}")
        job = out.strip().split(";")[0]
        wait_for(lambda: self.job_state(job) == "RUNNING", timeout=20, what=f"job {job} to run on {node}")
        return job

    def job_state(self, job: str) -> str:
        return self.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()

    def jobs_on(self, node: str) -> list[str]:
        return self.run("squeue", "-h", "-w", node, "-o", "%i").split()

    def reset(self, node: str) -> None:
        """Back to plain idle whatever a test did: cancel its jobs, resume it."""
        self.run("scancel", "-w", node, check=False)
        wait_for(lambda: not self.jobs_on(node), timeout=30, what=f"jobs on {node} to end")
        if self.state(node) != "idle":
            self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        wait_for(lambda: self.state(node) == "idle", timeout=30, what=f"{node} to be idle")


def _write_config(root: Path, nodes: tuple[str, ...]) -> Path:
    conf = root / "slurm.conf"
    lines = [
        "ClusterName=t",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.sock",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "KillWait=5",
    ]
    for i, node in enumerate(nodes):
        rack = f"rack{1 + i // 2}"
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 "
            f"RealMemory=500 Feature={rack}"
        )
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _start_munge(root: Path) -> None:
    munge = root / "munge"
    munge.mkdir()
    munge.chmod(0o755)  # munged wants its socket folder reachable by everyone
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    shutil.chown(munge, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    subprocess.run(
        [
            "runuser", "-u", "munge", "--", "munged", "-S", f"{munge}/munge.sock", f"--key-file={key}",
            f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed",
        ],
        check=True, timeout=20,
    )  # fmt: skip
    wait_for(lambda: (munge / "munge.sock").exists(), timeout=10, what="munged's socket")


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pids: list[int | None]) -> None:
    """SIGTERM them all at once (a slurmd takes about 2 s to go), SIGKILL what is left after 5 s."""
    running = [pid for pid in pids if pid is not None and _alive(pid)]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in running):
        time.sleep(0.1)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stepd_pids(root: Path) -> list[int]:
    """The slurmstepd of this cluster (their spool folder is under our root)."""
    out = subprocess.run(["pgrep", "-f", "slurmstepd"], capture_output=True, text=True, check=False).stdout
    pids = []
    for pid in out.split():
        try:
            if str(root) in Path(f"/proc/{pid}/environ").read_text(errors="replace") or str(root) in Path(
                f"/proc/{pid}/cmdline"
            ).read_text(errors="replace"):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def _teardown(cluster: SlurmCluster) -> None:
    root = cluster.root
    cluster.run("scancel", "-p", PARTITION, check=False)
    # The daemons go anyway after the wait; leftover steps are killed below.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not cluster.run("squeue", "-h", "-o", "%i", check=False).split(), timeout=20, what="jobs")
    daemons = [_pid(root / "run" / f"slurmd-{node}.pid") for node in cluster.nodes]
    _stop([*daemons, _pid(root / "run" / "slurmctld.pid")])
    _stop(list(_stepd_pids(root)))
    _stop([_pid(root / "munge" / "munged.pid")])


def _start(root: Path, nodes: tuple[str, ...]) -> SlurmCluster:
    for sub in ("state", "run", "log", "spool"):
        (root / sub).mkdir(parents=True)
    for node in nodes:
        (root / "spool" / node).mkdir()
    conf = _write_config(root, nodes)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root=root, conf=conf, nodes=nodes, env=env)
    _start_munge(root)
    subprocess.run(["slurmctld", "-f", str(conf), "-c"], env=env, check=True, timeout=30)
    for node in nodes:
        subprocess.run(["slurmd", "-f", str(conf), "-N", node], env=env, check=True, timeout=30)

    def all_idle() -> bool:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).split()
        return len(states) == len(nodes) and all(s == "idle" for s in states)

    wait_for(all_idle, timeout=60, what="every Slurm node to be idle")
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    # Not under pytest's base folder: that one is 0700 root, and munged runs as the munge user; a
    # short path also keeps munge's socket within sun_path (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="opsplanner-slurm-"))
    root.chmod(0o755)
    previous = os.environ.get("SLURM_CONF")
    cluster: SlurmCluster | None = None
    try:
        cluster = _start(root, NODES)
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        if cluster is None:
            cluster = SlurmCluster(root=root, conf=root / "slurm.conf", nodes=NODES, env=dict(os.environ))
            cluster.env["SLURM_CONF"] = str(cluster.conf)
        _teardown(cluster)
        shutil.rmtree(root, ignore_errors=True)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
