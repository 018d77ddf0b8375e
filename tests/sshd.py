"""A real OpenSSH server for tests: Debian's sshd on loopback with its own host key, config and
port, accepting one generated client key (as the user running the tests: root in CI)."""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.processes import free_port, wait_for

SSHD = os.environ.get("SSHD_PATH", "/usr/sbin/sshd")
SSH_KEYGEN = "/usr/bin/ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")


@dataclass
class Sshd:
    """A running sshd: where it listens, who may log in with which key, and its known_hosts line."""

    address: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_key: Path
    log: Path
    process: subprocess.Popen

    def other_known_hosts(self, directory: Path) -> Path:
        """A known_hosts file naming this address and port with a different key (a changed host key)."""
        impostor = _keygen(directory / "impostor_host_key")
        path = directory / "known_hosts_changed"
        path.write_text(f"{self._pattern()} {impostor.with_suffix('.pub').read_text().strip()}\n")
        return path

    def _pattern(self) -> str:
        return f"[{self.address}]:{self.port}"


def _keygen(path: Path) -> Path:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return path


def _config(tmp: Path, port: int, host_key: Path, authorized: Path) -> Path:
    config = tmp / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {tmp / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                "StrictModes no",
                "MaxStartups 50",
                "MaxSessions 50",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    return config


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def start_sshd(tmp: Path) -> Sshd:
    if not os.access(SSHD, os.X_OK):
        raise AssertionError(f"sshd is not at {SSHD}: install Debian's openssh-server (`.ci/run` does)")
    tmp.mkdir(parents=True, exist_ok=True)
    # sshd insists on its privilege-separation directory, which Debian's service creates at boot.
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_key = _keygen(tmp / "ssh_host_ed25519_key")
    client_key = _keygen(tmp / "client_ed25519")
    authorized = tmp / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    port = free_port()
    config = _config(tmp, port, host_key, authorized)
    log = tmp / "sshd.log"
    # sshd refuses a relative path to itself (it re-executes itself for each connection).
    command = [SSHD, "-D", "-e", "-f", str(config), "-p", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    known_hosts = tmp / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text().strip()}\n")
    server = Sshd("127.0.0.1", port, getpass.getuser(), client_key, known_hosts, host_key, log, process)
    try:
        wait_for(lambda: _listening(port) or process.poll() is not None, timeout=20, what="sshd")
    except AssertionError:
        stop_sshd(server)
        raise
    if process.poll() is not None:
        raise AssertionError(f"sshd exited:\n{log.read_text()[-3000:]}")
    return server


def stop_sshd(server: Sshd) -> None:
    if server.process.poll() is None:
        # The listener and its own session; each connection's child ends with its connection.
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@contextlib.contextmanager
def running_sshd(tmp: Path) -> Iterator[Sshd]:
    """A started sshd, stopped on leaving (a test module's fixture wraps this)."""
    server = start_sshd(tmp)
    try:
        yield server
    finally:
        stop_sshd(server)
