"""Named people for permission tests (healthchecks' owner/teammate/stranger idea).

viewer, requester and approver hold one role each; stranger has an account but no role.
Imported by tests/web/conftest.py and tests/api/conftest.py.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from gpuadmin.accounts.roles import Role


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    # The default hasher costs ~100 ms a user on a small CI box; these tests are not about hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _person(username: str, role: Role | None) -> User:
    user = User.objects.create_user(username=username, password="correct horse battery")
    if role is not None:
        user.groups.add(Group.objects.get(name=role.value))
    return user


@pytest.fixture
def viewer(db: None) -> User:
    return _person("vera", Role.VIEWER)


@pytest.fixture
def requester(db: None) -> User:
    return _person("rick", Role.REQUESTER)


@pytest.fixture
def approver(db: None) -> User:
    return _person("april", Role.APPROVER)


@pytest.fixture
def stranger(db: None) -> User:
    return _person("sam", None)


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    return client_for(viewer)


@pytest.fixture
def requester_client(requester: User) -> Client:
    return client_for(requester)
