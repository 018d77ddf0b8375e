"""A thin wrapper over Slurm's command-line tools (`sinfo`, `squeue`, `scontrol`).

Slurm 22.05 has no JSON from `scontrol`, its REST daemon cannot update a node, and `pyslurm` only
matches newer releases, so the drainer reads and writes nodes through the tools' text forms:
`sinfo -h -N -n X -o '%N|%T|%E'` for the state and reason, `squeue -h -w X -t R,CG,S` for the jobs,
`scontrol update NodeName=X State=DRAIN|RESUME` and `scontrol reboot ASAP nextstate=RESUME` for the
changes. `SLURM_CONF` (or the `conf` given) says which cluster."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

# Flags `sinfo %T` appends to a state: * not responding, ~ powered off, # powering up, ! pending
# power down, % powering down, $ maintenance, @ pending reboot, ^ rebooting, - planned.
STATE_FLAGS = "*~#!%$@^-"
DRAIN_STATES = frozenset({"draining", "drained"})
# A resumed node that is responding and schedulable: idle, already running a new job ("allocated+":
# while another completes), planned for one by the backfill scheduler, or idle in an advanced
# reservation. A maintenance reservation ("maint", "$") or a reboot ("@", "^") is not in service.
SCHEDULABLE_STATES = frozenset({"idle", "allocated", "allocated+", "mixed", "completing", "planned", "reserved"})
# Flags that leave a node taking jobs: power saving (Slurm powers it up for the next job; ~ # ! %)
# and planned (-).
SCHEDULABLE_FLAGS = frozenset("~#!%-")


class SlurmError(Exception):
    """A Slurm tool failed or is missing; the message is one line naming the command."""


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    user: str

    def __str__(self) -> str:
        return f"{self.id} {self.name} ({self.user})"


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # as `sinfo %T` prints it, flags included: "draining", "idle*", "drained@"
    reason: str  # "" when none

    @property
    def base(self) -> str:
        return self.state.rstrip(STATE_FLAGS)

    @property
    def responding(self) -> bool:
        return "*" not in self.state

    @property
    def drain(self) -> bool:
        """Drained or on its way: no new job lands on it."""
        return self.base in DRAIN_STATES

    @property
    def drained(self) -> bool:
        return self.base == "drained"

    @property
    def schedulable(self) -> bool:
        """Back in service: responding, no drain, no pending reboot, in a state that takes jobs."""
        flags = self.state[len(self.base) :]
        return self.base in SCHEDULABLE_STATES and set(flags) <= SCHEDULABLE_FLAGS


class Slurm:
    """The cluster that `conf` (else `SLURM_CONF`, else Slurm's default) names."""

    def __init__(self, *, conf: str | None = None, timeout_s: float = 30.0) -> None:
        self.env = dict(os.environ)
        if conf:
            self.env["SLURM_CONF"] = conf
        self.timeout_s = timeout_s

    def _run(self, args: Sequence[str]) -> str:
        try:
            done = subprocess.run(
                list(args), env=self.env, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError as exc:
            raise SlurmError(f"{args[0]} not found: install Slurm's client tools (slurm-client)") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(args)} took more than {self.timeout_s:.0f}s") from exc
        if done.returncode != 0:
            why = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[0]
            raise SlurmError(f"{' '.join(args)}: {why}")
        return done.stdout

    def node(self, name: str) -> NodeState:
        """The node's state and drain reason; SlurmError when Slurm does not know it."""
        out = self._run(["sinfo", "-h", "-N", "-n", name, "-o", "%N|%T|%E"])
        # One line per partition the node is in; they agree on the state.
        for line in out.splitlines():
            node, state, reason = ([*line.split("|", 2), "", ""])[:3]
            if node == name:
                return NodeState(name=name, state=state.strip(), reason="" if reason == "none" else reason.strip())
        raise SlurmError(f"Slurm has no node named {name!r}")

    def jobs(self, name: str) -> list[Job]:
        """The jobs running, completing or suspended on the node (those a drain waits for)."""
        out = self._run(["squeue", "-h", "-w", name, "-t", "R,CG,S", "-o", "%i|%j|%u"])
        jobs = []
        for line in out.splitlines():
            if line.strip():
                job, job_name, user = ([*line.split("|", 2), "", ""])[:3]
                jobs.append(Job(id=job.strip(), name=job_name.strip(), user=user.strip()))
        return jobs

    def boot_time(self, name: str) -> str:
        """The node's BootTime as `scontrol` prints it: changes when the node really rebooted."""
        out = self._run(["scontrol", "-o", "show", "node", name])
        for field in out.split():
            if field.startswith("BootTime="):
                return field.removeprefix("BootTime=")
        return ""

    def drain(self, name: str, reason: str) -> None:
        self._run(["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"])

    def resume(self, name: str) -> None:
        self._run(["scontrol", "update", f"NodeName={name}", "State=RESUME"])

    def reboot(self, name: str, reason: str) -> None:
        """Reboot once idle (drains first) and resume afterwards, clearing the drain."""
        self._run(["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", name])
