"""`simulate --work-dir`: a long simulation keeps each shard's result and, run again, resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from simulation.config import SimulationConfig
from simulation.runner import Job, lanes_claimed, scratch_databases_drop, shard_jobs, shard_result_name

TWO_POOLS = [
    "--hosts",
    "40",
    "--pools",
    "2",
    "--hosts-per-domain",
    "10",
    "--days",
    "1",
    "--seed",
    "3",
    "--upgrades-at-start",
    "1",
]


def without_timing(runs: dict) -> dict:
    return {
        key: [{k: v for k, v in shard.items() if k != "wall_seconds"} for shard in shards]
        for key, shards in runs.items()
    }


def simulate(work: Path, out: Path, *extra: str) -> dict:
    call_command("simulate", *TWO_POOLS, "--policies", "rolling", "--lanes", "1", "--work-dir", str(work),
                 "--out", str(out), *extra)  # fmt: skip
    return json.loads((out / "runs.json").read_text())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the run creates scratch databases: no enclosing transaction
def test_a_rerun_with_the_same_work_dir_runs_only_the_shards_the_first_left_missing_or_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    first = simulate(work, tmp_path / "first")
    shards = sorted(work.glob("shard-*.json"))
    assert len(shards) == 2  # one per pool
    assert not list(work.glob("*.part"))  # each written whole, then renamed
    shards[0].unlink()  # as if the run had been stopped before this shard ended
    shards[1].write_text(shards[1].read_text()[:100])  # or its file had been cut short
    capsys.readouterr()

    again = simulate(work, tmp_path / "again")

    assert without_timing(again) == without_timing(first)  # what ran again came out the same
    assert all(pool["drains"] > 0 for shard in first["rolling"] for pool in shard["pools"])  # and did work
    assert "2 shards to run, 1 at a time" in capsys.readouterr().err
    kept_before = {path.name: path.read_text() for path in work.glob("shard-*.json")}

    third = simulate(work, tmp_path / "third")

    assert third == again  # nothing ran: every shard kept, wall times included
    err = capsys.readouterr().err
    assert "2 of 2 shards kept" in err
    assert "to run" not in err
    assert {path.name: path.read_text() for path in work.glob("shard-*.json")} == kept_before


def job(**changes: object) -> Job:
    config = SimulationConfig(hosts=40, pools=2, hosts_per_domain=10, days=1, policies=("trains", "rolling"))
    policy = str(changes.pop("policy", "rolling"))
    return Job(policy=policy, pools=(1,), config=config.replace(**changes), key=policy)


def test_a_shards_result_file_is_named_by_what_decides_it_and_not_by_the_other_policies_of_the_run() -> None:
    assert shard_result_name(job()) == shard_result_name(job(policies=("rolling",)))
    assert shard_result_name(job()) != shard_result_name(job(seed=2))
    assert shard_result_name(job()) != shard_result_name(job(days=2))
    assert shard_result_name(job()) != shard_result_name(job(policy="trains"))
    names = {shard_result_name(j) for j in shard_jobs(job().config)}
    assert len(names) == 4  # two policies by two pools, each its own file
    assert all(name.startswith(("shard-trains-", "shard-rolling-")) for name in names)


def test_a_work_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")

    with pytest.raises(CommandError, match=r"^--work-dir: cannot use .*taken/inside: Not a directory$"):
        call_command("simulate", *TWO_POOLS, "--work-dir", str(taken / "inside"))


def databases_named(pattern: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1", [pattern])
        return [name for (name,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)  # the run creates scratch databases: no enclosing transaction
def test_a_run_uses_lanes_of_its_own_and_drops_those_a_killed_run_left_but_not_a_running_ones(tmp_path: Path) -> None:
    # Two runs at once shared the same lane names, and the second dropped the first's lanes under it.
    base = connection.settings_dict["NAME"]
    killed, running = f"{base}_clirun999999991_0_sim", f"{base}_clirun999999992_0_sim"
    with connection.cursor() as cursor:
        for name in (killed, running):
            cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        with lanes_claimed("_clirun999999992"):  # a run still going
            call_command("simulate", *TWO_POOLS, "--policies", "rolling", "--lanes", "1", "--out", str(tmp_path))
            assert databases_named(f"{base}_cli%_sim") == [running]  # its own lanes are gone too
    finally:
        scratch_databases_drop([f"postgresql:///{name}" for name in (killed, running)])
