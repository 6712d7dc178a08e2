"""Fixtures of directory sign-in, imported by tests/conftest.py (for every directory): one slapd and
one OpenID Connect provider for the session (tests/services.py), holding the lab below, and
settings that point at them as an admin's GPUADMIN_LDAP_* / GPUADMIN_OIDC_* would.

People (password = their name + "-pw"): alice (groups: approvers, requesters), bob (viewers),
carol (disabled: her shell is nologin, which the user filter excludes). Each test that changes the
directory puts it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests import services

try:
    import ldap
except ImportError:  # python-ldap is the `ldap` extra: it builds against libldap2-dev
    ldap = None

SUFFIX = services.LDAP_SUFFIX
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
GROUP = {role: f"cn=gpu-{role}s,{GROUPS}" for role in ("viewer", "requester", "approver")}
USER_FILTER = "(&(objectClass=posixAccount)(uid=%(user)s)(!(loginShell=/usr/sbin/nologin)))"


def _person(uid: str, number: int, shell: str = "/bin/bash") -> str:
    return (f"dn: uid={uid},{PEOPLE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            f"uid: {uid}\ncn: {uid.title()} Liddell\ngivenName: {uid.title()}\nsn: Liddell\n"
            f"mail: {uid}@lab.example\nuidNumber: {number}\ngidNumber: 100\n"
            f"homeDirectory: /home/{uid}\nloginShell: {shell}\nuserPassword: {uid}-pw\n\n")


def _group(dn: str, members: list[str]) -> str:
    cn = dn.split(",", maxsplit=1)[0].split("=")[1]
    # groupOfNames needs a member: a placeholder, as labs do, so the last person can leave.
    lines = f"member: cn=nobody,{SUFFIX}\n" + "".join(f"member: uid={m},{PEOPLE}\n" for m in members)
    return f"dn: {dn}\nobjectClass: groupOfNames\ncn: {cn}\n{lines}\n"


LAB = (
    f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n\n"
    f"dn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups\n\n"
    + _person("alice", 2001) + _person("bob", 2002) + _person("carol", 2003, "/usr/sbin/nologin")
    + _group(GROUP["approver"], ["alice"]) + _group(GROUP["requester"], ["alice"])
    + _group(GROUP["viewer"], ["bob"])
)


@pytest.fixture(scope="session")
def slapd() -> Iterator[services.SlapdServer]:
    if ldap is None:
        services.missing("python-ldap is not installed (the `ldap` extra; Debian: apt-get install "
                         "libldap2-dev libsasl2-dev, then pip install -e '.[ldap]')")
    try:
        with services.slapd_server(LAB) as server:
            yield server
    except services.ServiceMissing as exc:
        services.missing(str(exc))


def as_root(server: services.SlapdServer) -> Any:
    """A connection bound as the directory's root, over StartTLS (to change the lab)."""
    connection = ldap.initialize(server.url)
    connection.set_option(ldap.OPT_X_TLS_CACERTFILE, str(server.ca_file))
    connection.set_option(ldap.OPT_X_TLS_REQUIRE_CERT, ldap.OPT_X_TLS_DEMAND)
    connection.set_option(ldap.OPT_X_TLS_NEWCTX, 0)
    connection.start_tls_s()
    connection.simple_bind_s(server.root_dn, server.root_password)
    return connection


@pytest.fixture
def ldap_directory(slapd: services.SlapdServer) -> Iterator[Any]:
    """The root connection; group members a test removes come back after it."""
    connection = as_root(slapd)
    before = {dn: connection.search_s(dn, ldap.SCOPE_BASE, attrlist=["member"])[0][1]["member"]
              for dn in GROUP.values()}
    yield connection
    for dn, members in before.items():
        connection.modify_s(dn, [(ldap.MOD_REPLACE, "member", members)])
    connection.unbind_s()


@pytest.fixture
def use_ldap(slapd: services.SlapdServer, settings: Any, monkeypatch: pytest.MonkeyPatch
             ) -> Callable[..., dict[str, Any]]:
    """Configure LDAP sign-in as an admin would, through GPUADMIN_LDAP_* (search mode, StartTLS by
    default); keyword arguments set or (None) unset more of them. Returns the settings made."""
    from gpuadmin.accounts.directory import config

    def configure(**env: str | None) -> dict[str, Any]:
        values: dict[str, str | None] = {
            "GPUADMIN_LDAP_SERVER_URI": slapd.url, "GPUADMIN_LDAP_START_TLS": "1",
            "GPUADMIN_LDAP_CA_FILE": str(slapd.ca_file),
            "GPUADMIN_LDAP_BIND_DN": slapd.root_dn, "GPUADMIN_LDAP_BIND_PASSWORD": slapd.root_password,
            "GPUADMIN_LDAP_USER_SEARCH_BASE": PEOPLE, "GPUADMIN_LDAP_USER_FILTER": USER_FILTER,
            "GPUADMIN_LDAP_GROUP_SEARCH_BASE": GROUPS,
            **{f"GPUADMIN_LDAP_{role.upper()}_GROUP": dn for role, dn in GROUP.items()},
            **env,
        }
        for name, value in values.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        found = config.ldap_settings()
        for name, value in found.items():
            setattr(settings, name, value)
        settings.AUTHENTICATION_BACKENDS = [
            "axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend",
            config.LDAP_BACKEND,
        ]
        return found

    return configure


# --- OpenID Connect -----------------------------------------------------------------------------

# The provider's people and the groups claim's values; conftest's LDAP lab has the same people.
OIDC_PEOPLE = {
    "alice": {"password": "alice-pw", "email": "alice@lab.example",
              "groups": ["gpu-approvers", "gpu-requesters"]},
    "bob": {"password": "bob-pw", "email": "bob@lab.example", "groups": ["gpu-viewers"]},
}


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[services.OidcProvider]:
    try:
        with services.oidc_provider(OIDC_PEOPLE) as provider:
            yield provider
    except services.ServiceMissing as exc:
        services.missing(str(exc))


@pytest.fixture
def use_oidc(oidc_provider: services.OidcProvider, settings: Any, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[services.OidcProvider]:
    """OpenID Connect sign-in configured as an admin would (GPUADMIN_OIDC_*), against the test
    provider; its people are put back after the test."""
    from gpuadmin.accounts.directory import config

    env = {**oidc_provider.environment(),
           **{f"GPUADMIN_OIDC_{role.upper()}_GROUP": f"gpu-{role}s" for role in config.ROLE_NAMES}}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name, value in config.oidc_settings().items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [
        "axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend",
        config.OIDC_BACKEND,
    ]
    yield oidc_provider
    oidc_provider.set_people(OIDC_PEOPLE)
