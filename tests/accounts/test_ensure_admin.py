"""manage.py ensure_admin: the superuser `make run` makes sure of."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def ensure_admin() -> str:
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    return out.getvalue()


def test_without_a_password_one_is_generated_and_printed_once(monkeypatch) -> None:
    monkeypatch.delenv("GPUADMIN_ADMIN_USER", raising=False)
    monkeypatch.delenv("GPUADMIN_ADMIN_PASSWORD", raising=False)

    first = ensure_admin()
    second = ensure_admin()

    password = re.search(r"created admin account 'admin' with password: (\S+)", first).group(1)
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password(password)
    assert password not in second and "exists; left unchanged" in second


def test_name_and_password_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("GPUADMIN_ADMIN_USER", "lab-lead")
    monkeypatch.setenv("GPUADMIN_ADMIN_PASSWORD", "s3cret-enough")

    output = ensure_admin()

    assert "s3cret-enough" not in output
    assert get_user_model().objects.get(username="lab-lead").check_password("s3cret-enough")
    assert not get_user_model().objects.filter(username="admin").exists()


def test_an_existing_account_keeps_the_password_it_was_changed_to(monkeypatch) -> None:
    monkeypatch.setenv("GPUADMIN_ADMIN_USER", "lab-lead")
    monkeypatch.setenv("GPUADMIN_ADMIN_PASSWORD", "s3cret-enough")
    ensure_admin()
    admin = get_user_model().objects.get(username="lab-lead")
    admin.set_password("changed-on-the-site")
    admin.save()

    ensure_admin()

    assert get_user_model().objects.get(username="lab-lead").check_password("changed-on-the-site")


def test_a_short_password_is_refused_and_nothing_is_created(monkeypatch) -> None:
    monkeypatch.setenv("GPUADMIN_ADMIN_USER", "lab-lead")
    monkeypatch.setenv("GPUADMIN_ADMIN_PASSWORD", "short")

    with pytest.raises(CommandError, match="at least 8 characters"):
        ensure_admin()
    assert not get_user_model().objects.filter(username="lab-lead").exists()
