"""Named people for permission tests (healthchecks' owner/teammate/stranger idea).

viewer, requester and approver hold one role each (second_approver is another
approver); stranger has an account but no role. tests/conftest.py registers the
fixtures for the whole suite. `_fast_password_hashing` is autouse only where a
conftest imports it (web, api, audit, kills), not suite-wide: hashes made with
it are unreadable to a server started in a subprocess with the real settings.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from gpuadmin.accounts.roles import Role

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    # The default hasher costs ~100 ms a user on a small CI box; these tests are not about hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_person(username: str, *roles: Role) -> User:
    user = User.objects.create_user(username=username, password=PASSWORD)
    for role in roles:
        user.groups.add(Group.objects.get(name=role.value))
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db: None) -> User:
    return make_person("vera", Role.VIEWER)


@pytest.fixture
def requester(db: None) -> User:
    return make_person("rick", Role.REQUESTER)


@pytest.fixture
def approver(db: None) -> User:
    return make_person("april", Role.APPROVER)


@pytest.fixture
def second_approver(db: None) -> User:
    return make_person("abe", Role.APPROVER)


@pytest.fixture
def stranger(db: None) -> User:
    return make_person("sam")


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    return client_for(viewer)


@pytest.fixture
def requester_client(requester: User) -> Client:
    return client_for(requester)
