"""The embedded default's broker (config/embedded_broker.py), with real processes on one SQLite file.

Producers in other processes write while a consumer reads: every message arrives whole and once; a
consumer killed with kill -9 after taking a message loses nothing (the message comes back after the
visibility timeout); acknowledged messages are gone; a rejected one comes back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection, Exchange, Queue

from config.embedded_broker import embedded_broker_register
from tests.processes import ROOT, wait_for

pytestmark = pytest.mark.slow

embedded_broker_register()


def _work() -> Queue:
    return Queue("work", Exchange("work"), routing_key="work")


def _connection(path: Path, visibility_timeout: float = 600) -> Connection:
    return Connection(
        "opsqlite://",
        transport_options={"path": str(path), "polling_interval": 0.01, "visibility_timeout": visibility_timeout},
    )


def _drain(connection: Connection, queue: str, *, until: int, timeout: float) -> list[dict]:
    received: list[dict] = []
    simple = connection.SimpleQueue(Queue(queue, Exchange(queue), routing_key=queue))
    deadline = time.monotonic() + timeout
    while len(received) < until and time.monotonic() < deadline:
        try:
            message = simple.get(timeout=0.5)
        except Empty:
            continue
        received.append(message.payload)
        message.ack()
    simple.close()
    return received


PRODUCER = textwrap.dedent(
    """
    import sys
    from kombu import Connection, Exchange, Queue
    from config.embedded_broker import embedded_broker_register
    embedded_broker_register()
    path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Connection("opsqlite://", transport_options={"path": path}) as connection:
        queue = connection.SimpleQueue(Queue("work", Exchange("work"), routing_key="work"))
        for i in range(count):
            # Large bodies make a half-written message likely if writes were not atomic.
            queue.put({"producer": name, "n": i, "pad": "x" * 20000})
        queue.close()
    """
)


def test_messages_written_by_other_processes_arrive_whole_and_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    producers = [
        subprocess.Popen([sys.executable, "-c", PRODUCER, str(path), name, "300"], cwd=ROOT) for name in ("a", "b")
    ]
    with _connection(path) as connection:
        received = _drain(connection, "work", until=600, timeout=60)
    for producer in producers:
        assert producer.wait(timeout=60) == 0
    keys = [(message["producer"], message["n"]) for message in received]
    assert len(keys) == 600
    assert set(keys) == {(name, n) for name in ("a", "b") for n in range(300)}
    assert all(message["pad"] == "x" * 20000 for message in received)
    with _connection(path) as connection:
        assert connection.SimpleQueue(_work()).qsize() == 0  # acknowledged messages are deleted


CONSUMER_THAT_DIES = textwrap.dedent(
    """
    import sys, time
    from kombu import Connection, Exchange, Queue
    from config.embedded_broker import embedded_broker_register
    embedded_broker_register()
    with Connection("opsqlite://", transport_options={"path": sys.argv[1], "visibility_timeout": 2}) as connection:
        message = connection.SimpleQueue(Queue("work", Exchange("work"), routing_key="work")).get(timeout=30)
        print("took", message.payload["n"], flush=True)
        time.sleep(600)  # killed before it acknowledges
    """
)


def test_a_message_taken_by_a_consumer_killed_before_its_ack_is_delivered_again(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as connection:
        connection.SimpleQueue(_work()).put({"n": 7})
    consumer = subprocess.Popen(
        [sys.executable, "-c", CONSUMER_THAT_DIES, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline().strip() == "took 7"
        with _connection(path, visibility_timeout=2) as connection:
            # Taken and not yet timed out: nobody else gets it.
            assert _drain(connection, "work", until=1, timeout=1) == []
            os.kill(consumer.pid, signal.SIGKILL)
            consumer.wait(timeout=10)
            again = _drain(connection, "work", until=1, timeout=10)
        assert again == [{"n": 7}]
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()


def test_a_rejected_message_with_requeue_comes_back_and_without_it_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as connection:
        queue = connection.SimpleQueue(_work())
        queue.put({"n": 1})
        queue.put({"n": 2})
        first = queue.get(timeout=5)
        first.requeue()
        assert queue.get(timeout=5).payload == {"n": 1}  # requeued: visible again, still first in line
        second = queue.get(timeout=5)
        assert second.payload == {"n": 2}
        second.reject()
        with pytest.raises(Empty):
            queue.get(timeout=0.5)
        queue.close()


def test_unacknowledged_messages_are_restored_when_a_consumer_closes_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as connection:
        queue = connection.SimpleQueue(_work())
        queue.put({"n": 1})
        assert queue.get(timeout=5).payload == {"n": 1}  # taken, never acknowledged
        queue.close()
    with _connection(path) as connection:
        wait_for(lambda: connection.SimpleQueue(_work()).qsize() == 1, timeout=5, what="the message kept")
        assert _drain(connection, "work", until=1, timeout=5) == [{"n": 1}]
