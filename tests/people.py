"""Named people for permission tests (healthchecks' owner/teammate/stranger idea).

viewer, requester and approver hold one role each (second_approver is another
approver); stranger has an account but no role. tests/conftest.py registers the
fixtures for the whole suite, `fast_password_hashing` as autouse. Hashes made
with it are unreadable to a server started in a subprocess with the real
settings: a test whose users such a server must log in overrides it with a
fixture of the same name that does nothing, in its module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from gpuadmin.accounts.roles import Role

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def fast_password_hashing() -> Iterator[None]:
    # The default hasher costs ~100 ms a user on a small CI box; these tests are not about hashing.
    # override_settings, not pytest-django's `settings`: some tests parametrize a `settings` of their own.
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


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
