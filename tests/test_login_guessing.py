"""Password guessing: every surface that takes a password (HTTP Basic on /api/auth/login/, the login
page) stops checking a user's password after too many wrong ones in a row. DRF throttles only
after authentication, so a wrong password (refused while authenticating) was never counted."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from rest_framework.test import APIClient

from opsplanner.roles import Role
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db

PASSWORD = "x-pass-123"  # what make_user gives


@pytest.fixture(autouse=True)
def small_limit(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.LOGIN_FAILURES_LIMIT = 3


def basic_login(username: str, password: str, address: str = "127.0.0.1") -> int:
    credentials = base64.b64encode(f"{username}:{password}".encode()).decode()
    client = APIClient(REMOTE_ADDR=address)
    return client.post("/api/auth/login/", headers={"Authorization": f"Basic {credentials}"}).status_code


def test_after_too_many_wrong_passwords_the_api_refuses_even_the_right_one() -> None:
    user = make_user(Role.OPERATOR)
    assert [basic_login(user.username, f"guess-{n}") for n in range(3)] == [401, 401, 401]
    assert basic_login(user.username, PASSWORD) == 401
    other = make_user(Role.OPERATOR)
    assert basic_login(other.username, PASSWORD) == 200  # another user is not locked out


def test_the_login_page_and_the_api_count_the_same_failures() -> None:
    user = make_user(Role.VIEWER)
    for n in range(3):
        Client().post("/login/", {"username": user.username, "password": f"guess-{n}"})
    page = Client().post("/login/", {"username": user.username, "password": PASSWORD})
    assert page.status_code == 200, "the right password is refused: the form is shown again"
    assert basic_login(user.username, PASSWORD) == 401


def test_a_few_wrong_passwords_do_not_lock_anyone_out_and_a_success_starts_the_count_again() -> None:
    user = make_user(Role.VIEWER)
    for _ in range(3):
        assert basic_login(user.username, "wrong") == 401
        assert basic_login(user.username, "wrong") == 401
        assert basic_login(user.username, PASSWORD) == 200


def test_a_password_change_ends_the_lock() -> None:
    user = make_user(Role.VIEWER)
    for n in range(3):
        basic_login(user.username, f"guess-{n}")
    user.set_password("a-new-pass-456")
    user.save()
    assert basic_login(user.username, "a-new-pass-456") == 200


def test_wrong_passwords_from_one_address_do_not_lock_the_user_out_from_another(settings) -> None:
    settings.LOGIN_FAILURES_LIMIT_ALL_ADDRESSES = 5
    user = make_user(Role.OPERATOR)
    assert [basic_login(user.username, f"guess-{n}", "203.0.113.9") for n in range(3)] == [401, 401, 401]
    assert basic_login(user.username, PASSWORD, "203.0.113.9") == 401, "the guessing address is locked out"
    page = Client(REMOTE_ADDR="198.51.100.7").post("/login/", {"username": user.username, "password": PASSWORD})
    assert page.status_code == 302, "the user's own address still logs in"


def test_guesses_spread_over_many_addresses_lock_the_user_out_from_everywhere(settings) -> None:
    settings.LOGIN_FAILURES_LIMIT_ALL_ADDRESSES = 5
    user = make_user(Role.OPERATOR)
    for n in range(5):
        assert basic_login(user.username, f"guess-{n}", f"203.0.113.{n + 1}") == 401
    assert basic_login(user.username, PASSWORD, "198.51.100.7") == 401, "a fresh address is refused too"
    assert basic_login(make_user(Role.OPERATOR).username, PASSWORD, "198.51.100.7") == 200
