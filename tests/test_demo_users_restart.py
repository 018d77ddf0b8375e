"""`demo_users_ensure` runs at every `manage.py serve` start in DEBUG: a restart must not log anyone out."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from opsplanner.demo_users import credentials_file, demo_users_ensure


@pytest.mark.django_db
def test_a_second_start_keeps_the_demo_users_logged_in(settings, tmp_path: Path) -> None:
    settings.DEBUG = True  # the demo logins exist only in DEBUG
    settings.VAR_DIR = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; salted all the same
    (login, *_) = demo_users_ensure()
    browser = Client()
    assert browser.login(username=login.username, password=login.password)
    assert browser.get("/").wsgi_request.user.is_authenticated

    demo_users_ensure()  # the next `serve` start, same password in var/

    assert browser.get("/").wsgi_request.user.is_authenticated, "the restart logged the browser out"


@pytest.mark.django_db
def test_a_changed_password_file_still_resets_the_demo_password(settings, tmp_path: Path) -> None:
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; salted all the same
    demo_users_ensure()
    credentials_file().write_text("a-new-demo-password\n")
    demo_users_ensure()
    user = get_user_model().objects.get(username="operator")
    assert user.check_password("a-new-demo-password")
