"""The adapters' configuration readers (opsplanner_adapters.config): every mistake in a file is one
line naming the file, the table and the key, the same in each of the four programs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opsplanner_adapters.config import (
    ConfigError,
    api_settings,
    number,
    read_toml,
    setting,
    table,
)

ROOT = Path(__file__).resolve().parent.parent


def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as refused:
        call(*args, **kwargs)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_it_names_the_file_that_is_not_toml_or_cannot_be_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[api\n")

    assert refusal(read_toml, broken).startswith(f"{broken} is not valid TOML: ")
    assert (
        refusal(read_toml, tmp_path / "missing.toml")
        == f"cannot read {tmp_path}/missing.toml: No such file or directory"
    )


def test_it_names_a_table_that_is_not_a_table_and_treats_an_absent_one_as_empty() -> None:
    assert refusal(table, {"slurm": 3}, "slurm") == "[slurm] must be a table"
    assert table({}, "slurm") == {}


def test_a_number_names_its_table_and_key_and_refuses_true_and_values_below_the_minimum() -> None:
    assert number({"lease_s": 10}, "lease_s", 120, section="slurm", minimum=3) == 10.0
    assert number({}, "lease_s", 120, section="slurm", minimum=3) == 120.0
    assert refusal(number, {"lease_s": 1}, "lease_s", 120, section="slurm", minimum=3) == (
        "slurm.lease_s must be a number of at least 3, not 1"
    )
    assert refusal(number, {"poll_s": True}, "poll_s", 2, section="kubernetes") == (
        "kubernetes.poll_s must be a number of at least 0.1, not True"
    )


def test_a_setting_says_when_it_is_required_or_of_the_wrong_type() -> None:
    assert setting({"port": 2222}, "port", int, "[hosts.gpu-1]", 22) == 2222
    assert setting({}, "pool", int, "[executor]", None) is None
    assert refusal(setting, {}, "address", str, "[hosts.gpu-1]") == "[hosts.gpu-1]: `address` is required"
    assert refusal(setting, {"port": "22"}, "port", int, "[hosts.gpu-1]") == (
        "[hosts.gpu-1]: `port` must be int, not '22'"
    )
    assert refusal(setting, {"reboot_poll_s": False}, "reboot_poll_s", (int, float), "[ssh]") == (
        "[ssh]: `reboot_poll_s` must be int or float, not False"
    )


def test_the_api_table_needs_an_http_url_and_a_token(tmp_path: Path) -> None:
    def api(**values: object) -> str:
        return refusal(api_settings, {"api": values}, base=tmp_path, default_worker="w")

    assert api(url="ftp://x", token="t") == "api.url must be an http:// or https:// URL, not 'ftp://x'"
    assert api(url="http://x").startswith("api.token (or api.token_file) is required")
    assert api(url="http://x", token="").startswith("api.token must be a non-empty string")
    assert api(url="http://x", token_file="absent") == f"api.token_file {tmp_path}/absent: No such file or directory"
    (tmp_path / "empty").write_text("\n")
    assert api(url="http://x", token_file="empty").startswith(f"api.token_file {tmp_path}/empty is empty")
    assert api(url="http://x", token="t", timeout_s=0) == "api.timeout_s must be a number of at least 0.1, not 0"


def test_the_api_table_reads_a_token_file_relative_to_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "drainer.token").write_text("secret\n")

    settings = api_settings(
        {"api": {"url": "https://ops.example", "token_file": "drainer.token", "timeout_s": 5}},
        base=tmp_path,
        default_worker="slurm-drainer@ctl1",
    )

    assert (settings.url, settings.token, settings.worker, settings.timeout_s) == (
        "https://ops.example",
        "secret",
        "slurm-drainer@ctl1",
        5.0,
    )


@pytest.mark.parametrize(
    ("module", "prefix"),
    [
        ("agent", "opsplanner-agent: "),
        ("slurm_drainer", "opsplanner-slurm-drainer: "),
        ("kube_drainer", "opsplanner-kube-drainer: "),
        ("ssh_executor", "opsplanner-ssh-executor: {path}: "),
    ],
)
def test_each_program_says_a_missing_token_in_one_line_and_exits_with_2(
    tmp_path: Path, module: str, prefix: str
) -> None:
    path = tmp_path / "adapter.toml"
    path.write_text('[api]\nurl = "http://127.0.0.1:9"\n[agent]\nstate_dir = "s"\nlog_dir = "l"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}

    done = subprocess.run(
        [sys.executable, "-m", f"opsplanner_adapters.{module}", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert done.stderr.strip() == (
        prefix.format(path=path) + "api.token (or api.token_file) is required: an executor token from "
        "`manage.py token_create`"
    )
