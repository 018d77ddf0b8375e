"""Production users from the command line: the role groups exist after migrate, and user_add,
user_role, user_disable and token_create give a new install its operators, service owners, viewers
and executors (and their API tokens) without the admin or Python. Each refusal is one line and
writes nothing; each write records an event naming the shell user who acted."""

from __future__ import annotations

import datetime as dt
import getpass
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from opsplanner.management.commands._users_cli import cli_actor
from opsplanner.models import Event
from opsplanner.permissions import Action, user_can, user_roles
from opsplanner.roles import Role
from tests import processes
from tests.builders import make_service

pytestmark = pytest.mark.django_db

STRONG_PASSWORD = "correct-horse-battery-staple-42"
FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = FAST_HASHER


def run(command: str, *args: str, stdin: str | None = None) -> tuple[str, str]:
    """call_command, returning (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    extra = {"stdin": io.StringIO(stdin)} if stdin is not None else {}
    call_command(command, *args, stdout=out, stderr=err, **extra)
    return out.getvalue(), err.getvalue()


def refusal(command: str, *args: str, stdin: str | None = None) -> str:
    with pytest.raises(CommandError) as refused:
        run(command, *args, stdin=stdin)
    message = str(refused.value)
    assert "\n" not in message
    return message


def user_events(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind, subject_type="auth.user").order_by("id"))


def api_me(token: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get("/api/auth/me/").status_code


# --- the role groups ------------------------------------------------------------------------------
def test_the_role_groups_exist_after_migrate_without_anyone_ensuring_them() -> None:
    assert set(Role.ALL) <= set(Group.objects.values_list("name", flat=True))


def test_migrate_recreates_missing_role_groups_and_leaves_present_ones_alone() -> None:
    kept = Group.objects.get(name=Role.OPERATOR)
    Group.objects.filter(name__in=[Role.VIEWER, Role.EXECUTOR]).delete()

    call_command("migrate", verbosity=0)

    assert Group.objects.filter(name__in=Role.ALL).count() == len(Role.ALL)
    assert Group.objects.get(name=Role.OPERATOR).pk == kept.pk


# --- user_add -------------------------------------------------------------------------------------
def test_user_add_without_a_password_creates_a_token_only_user_with_exactly_that_role() -> None:
    out, _ = run("user_add", "alice", "--role", Role.OPERATOR, "--email", "alice@example.com")

    alice = User.objects.get(username="alice")
    assert list(alice.groups.values_list("name", flat=True)) == [Role.OPERATOR]
    assert not alice.has_usable_password()
    assert alice.email == "alice@example.com"
    assert not alice.is_staff
    assert not alice.is_superuser
    assert "no usable password" in out
    assert "token_create alice" in out
    (event,) = user_events("user.created")
    assert event.subject_id == alice.pk
    assert event.actor == cli_actor() == f"cli:{getpass.getuser()}"
    assert event.data == {"username": "alice", "role": Role.OPERATOR, "services": [], "password": "unusable"}


def test_user_add_reads_the_password_from_stdin_and_the_user_can_log_in_with_it() -> None:
    run("user_add", "bob", "--role", Role.VIEWER, "--password-stdin", stdin=STRONG_PASSWORD + "\n")

    assert Client().login(username="bob", password=STRONG_PASSWORD)
    assert user_events("user.created")[0].data["password"] == "set"
    assert STRONG_PASSWORD not in json.dumps(user_events("user.created")[0].data)


def test_user_add_makes_a_service_owner_the_owner_of_the_named_services_only() -> None:
    training, serving, other = make_service(name="training"), make_service(name="serving"), make_service(name="other")

    out, _ = run("user_add", "carol", "--role", Role.SERVICE_OWNER, "--service", "training", "--service", "serving")

    carol = User.objects.get(username="carol")
    assert set(carol.owned_services.all()) == {training, serving}
    assert user_can(carol, Action.MANAGE_OWN_SERVICE, training)
    assert not user_can(User.objects.get(pk=carol.pk), Action.MANAGE_OWN_SERVICE, other)
    assert not user_can(carol, Action.OPERATE)
    assert "owner of serving, training" in out
    assert user_events("user.created")[0].data["services"] == ["serving", "training"]


def test_it_refuses_an_unknown_role_and_writes_nothing() -> None:
    message = refusal("user_add", "dave", "--role", "wizard")

    assert "unknown role 'wizard'" in message
    assert Role.OPERATOR in message
    assert not User.objects.filter(username="dave").exists()
    assert not Event.objects.filter(subject_type="auth.user").exists()


def test_it_refuses_an_unknown_service_naming_it_and_writes_nothing() -> None:
    make_service(name="training")

    message = refusal("user_add", "erin", "--role", Role.SERVICE_OWNER, "--service", "training", "nosuch")

    assert "nosuch" in message
    assert "training" not in message
    assert not User.objects.filter(username="erin").exists()
    assert not Event.objects.filter(subject_type="auth.user").exists()


def test_it_refuses_services_for_a_role_that_owns_none() -> None:
    make_service(name="training")

    refusal("user_add", "frank", "--role", Role.VIEWER, "--service", "training")

    assert not User.objects.filter(username="frank").exists()


def test_it_refuses_a_weak_password_listing_every_reason() -> None:
    message = refusal("user_add", "gina", "--role", Role.OPERATOR, "--password-stdin", stdin="12345\n")

    assert "too short" in message
    assert "too common" in message
    assert "entirely numeric" in message
    assert not User.objects.filter(username="gina").exists()
    assert not Event.objects.filter(subject_type="auth.user").exists()


def test_it_refuses_a_password_like_the_username_and_an_empty_stdin() -> None:
    refusal("user_add", "harrietsmith", "--role", Role.OPERATOR, "--password-stdin", stdin="harrietsmith1\n")
    refusal("user_add", "harrietsmith", "--role", Role.OPERATOR, "--password-stdin", stdin="")

    assert not User.objects.filter(username="harrietsmith").exists()


def test_it_refuses_an_existing_name_and_leaves_that_user_as_it_was() -> None:
    run("user_add", "ivan", "--role", Role.VIEWER)

    message = refusal("user_add", "ivan", "--role", Role.OPERATOR)

    assert "already exists" in message
    assert user_roles(User.objects.get(username="ivan")) == {Role.VIEWER}
    assert len(user_events("user.created")) == 1


def test_it_refuses_an_invalid_username() -> None:
    refusal("user_add", "bad name!", "--role", Role.VIEWER)

    assert not User.objects.exists()


# --- user_role ------------------------------------------------------------------------------------
def test_user_role_replaces_the_role_group_and_keeps_other_groups() -> None:
    run("user_add", "judy", "--role", Role.VIEWER)
    judy = User.objects.get(username="judy")
    judy.groups.add(Group.objects.create(name="admin-readers"))

    out, _ = run("user_role", "judy", "--role", Role.OPERATOR)

    assert set(judy.groups.values_list("name", flat=True)) == {Role.OPERATOR, "admin-readers"}
    assert "judy now has role operator" in out
    (event,) = user_events("user.role_changed")
    assert event.data["roles_before"] == [Role.VIEWER]
    assert event.data["role"] == Role.OPERATOR
    assert event.actor == cli_actor()


def test_user_role_sets_a_service_owners_services_and_another_role_clears_them() -> None:
    make_service(name="training")
    make_service(name="serving")
    run("user_add", "kim", "--role", Role.SERVICE_OWNER, "--service", "training")

    run("user_role", "kim", "--role", Role.SERVICE_OWNER, "--service", "serving")
    assert list(User.objects.get(username="kim").owned_services.values_list("name", flat=True)) == ["serving"]
    run("user_role", "kim", "--role", Role.SERVICE_OWNER)
    assert list(User.objects.get(username="kim").owned_services.values_list("name", flat=True)) == ["serving"]

    run("user_role", "kim", "--role", Role.VIEWER)

    kim = User.objects.get(username="kim")
    assert user_roles(kim) == {Role.VIEWER}
    assert not kim.owned_services.exists()
    last = user_events("user.role_changed")[-1]
    assert last.data["services_before"] == ["serving"]
    assert last.data["services"] == []


def test_user_role_refuses_an_unknown_user_role_or_service_and_changes_nothing() -> None:
    run("user_add", "leo", "--role", Role.VIEWER)

    assert "no user named 'nobody'" in refusal("user_role", "nobody", "--role", Role.OPERATOR)
    refusal("user_role", "leo", "--role", "wizard")
    refusal("user_role", "leo", "--role", Role.SERVICE_OWNER, "--service", "nosuch")

    assert user_roles(User.objects.get(username="leo")) == {Role.VIEWER}
    assert not user_events("user.role_changed")


# --- user_disable ---------------------------------------------------------------------------------
def test_a_disabled_user_can_no_longer_log_in_nor_use_a_session_or_token() -> None:
    run("user_add", "mia", "--role", Role.OPERATOR, "--password-stdin", stdin=STRONG_PASSWORD + "\n")
    token = run("token_create", "mia")[0].strip()
    browser = Client()
    assert browser.login(username="mia", password=STRONG_PASSWORD)
    other_session = Client()
    other_session.login(username="mia", password=STRONG_PASSWORD)
    assert api_me(token) == 200
    assert browser.get(reverse("home")).status_code == 200

    out, _ = run("user_disable", "mia", "--reason", "left the team")

    assert "2 session(s) ended" in out
    assert "1 token(s) revoked" in out
    mia = User.objects.get(username="mia")
    assert not mia.is_active
    assert not AuthToken.objects.filter(user=mia).exists()
    assert not Session.objects.filter(expire_date__gt=timezone.now()).exists()
    assert api_me(token) == 401
    assert browser.get(reverse("home")).status_code == 302
    assert not Client().login(username="mia", password=STRONG_PASSWORD)
    (event,) = user_events("user.disabled")
    assert event.reason == "left the team"
    assert event.data["tokens_revoked"] == 1
    assert event.actor == cli_actor()


def test_user_disable_leaves_other_users_sessions_and_tokens_alone() -> None:
    for name in ("nina", "oscar"):
        run("user_add", name, "--role", Role.VIEWER, "--password-stdin", stdin=STRONG_PASSWORD + "\n")
    oscar_token = run("token_create", "oscar")[0].strip()
    oscar_browser = Client()
    oscar_browser.login(username="oscar", password=STRONG_PASSWORD)
    Client().login(username="nina", password=STRONG_PASSWORD)

    run("user_disable", "nina")

    assert api_me(oscar_token) == 200
    assert oscar_browser.get(reverse("home")).status_code == 200


def test_it_refuses_to_disable_an_unknown_or_already_disabled_user() -> None:
    run("user_add", "pat", "--role", Role.VIEWER)
    run("user_disable", "pat")

    assert "already disabled" in refusal("user_disable", "pat")
    refusal("user_disable", "nobody")

    assert len(user_events("user.disabled")) == 1


# --- token_create ---------------------------------------------------------------------------------
def test_token_create_prints_only_the_token_which_authenticates_the_api(settings) -> None:
    run("user_add", "exec-1", "--role", Role.EXECUTOR)

    out, err = run("token_create", "exec-1", "--description", "slurm drainer on head-01")

    token = out.removesuffix("\n")
    assert "\n" not in token
    assert token
    assert token not in err
    assert "shown only this once" in err
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    me = client.get("/api/auth/me/")
    assert me.status_code == 200
    assert me.json()["username"] == "exec-1"
    assert me.json()["roles"] == [Role.EXECUTOR]
    (stored,) = AuthToken.objects.filter(user__username="exec-1")
    expected = timezone.now() + settings.REST_KNOX["TOKEN_TTL"]
    assert abs(stored.expiry - expected) < dt.timedelta(minutes=1)
    (event,) = user_events("user.token_created")
    assert token not in json.dumps(event.data) + event.reason
    assert event.data["description"] == "slurm drainer on head-01"
    assert event.actor == cli_actor()


def test_token_create_honours_the_ttl_and_refuses_one_out_of_bounds() -> None:
    run("user_add", "exec-2", "--role", Role.EXECUTOR)

    run("token_create", "exec-2", "--ttl", "2")

    (stored,) = AuthToken.objects.filter(user__username="exec-2")
    assert abs(stored.expiry - (timezone.now() + dt.timedelta(hours=2))) < dt.timedelta(minutes=1)
    for hours in ("0", "-3", "100000000000"):
        assert "hours" in refusal("token_create", "exec-2", "--ttl", hours)
    assert AuthToken.objects.filter(user__username="exec-2").count() == 1


def test_token_create_refuses_an_unknown_or_disabled_user_and_beyond_the_token_limit(settings) -> None:
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_LIMIT_PER_USER": 2}
    run("user_add", "exec-3", "--role", Role.EXECUTOR)
    run("user_add", "exec-4", "--role", Role.EXECUTOR)
    run("user_disable", "exec-4")

    refusal("token_create", "nobody")
    assert "disabled" in refusal("token_create", "exec-4")
    run("token_create", "exec-3")
    run("token_create", "exec-3")
    assert "already has 2 live tokens" in refusal("token_create", "exec-3")

    assert AuthToken.objects.filter(user__username__in=["exec-3", "exec-4"]).count() == 2
    assert len(user_events("user.token_created")) == 2


# --- real processes -------------------------------------------------------------------------------
def manage(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        DATABASE_URL=processes.test_database_url(),
        DEBUG="1",
        OPSPLANNER_VAR_DIR=str(tmp_path / "var"),
    )
    command = [sys.executable, "manage.py", *args]
    return subprocess.run(
        command, cwd=processes.ROOT, env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.django_db(transaction=True)
def test_a_new_install_gets_an_operator_and_a_token_from_the_shell(tmp_path: Path, settings) -> None:
    settings.PASSWORD_HASHERS = [*FAST_HASHER, "django.contrib.auth.hashers.PBKDF2PasswordHasher"]  # the process's
    refused = manage(tmp_path, "user_add", "root-op", "--role", "wizard")
    assert refused.returncode != 0
    assert refused.stdout == ""
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "unknown role" in refused.stderr
    assert "Traceback" not in refused.stderr

    added = manage(tmp_path, "user_add", "root-op", "--role", "operator", "--password-stdin", stdin=STRONG_PASSWORD)
    assert added.returncode == 0, added.stderr
    created = manage(tmp_path, "token_create", "root-op", "--ttl", "1")
    assert created.returncode == 0, created.stderr

    assert Client().login(username="root-op", password=STRONG_PASSWORD)
    token = created.stdout.removesuffix("\n")
    assert "\n" not in token
    assert token not in created.stderr
    assert api_me(token) == 200
    assert Event.objects.filter(kind="user.created", actor=cli_actor()).count() == 1
