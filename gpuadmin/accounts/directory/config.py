"""The directory's settings, read from the environment by gpuadmin/settings.py (imports no models).

LDAP when GPUADMIN_LDAP_SERVER_URI is set (``ldap_settings``: django-auth-ldap's AUTH_LDAP_*),
OpenID Connect when GPUADMIN_OIDC_CLIENT_ID is (``oidc_settings``: mozilla-django-oidc's OIDC_*);
both name the directory group of each role (``role_groups``). A setting that cannot work (plain
LDAP, a missing endpoint) stops the start with its name.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from gpuadmin.env import env_bool, env_secret, env_str

LDAP_BACKEND = "gpuadmin.accounts.directory.ldap.DirectoryLDAPBackend"
OIDC_BACKEND = "gpuadmin.accounts.directory.oidc.DirectoryOIDCBackend"
# accounts.roles.Role's values (that module imports models, which settings may not yet).
ROLE_NAMES = ("viewer", "requester", "approver")
DEFAULT_USER_FILTER = "(&(objectClass=posixAccount)(uid=%(user)s))"
# Seconds to wait for the directory: a dead server must not hold a login page for minutes.
NETWORK_TIMEOUT_SECONDS = 5
OPERATION_TIMEOUT_SECONDS = 10


def role_groups(prefix: str) -> dict[str, str]:
    """{role: directory group} from PREFIX_VIEWER_GROUP, PREFIX_REQUESTER_GROUP, PREFIX_APPROVER_GROUP."""
    found = {}
    for role in ROLE_NAMES:
        group = env_str(f"{prefix}_{role.upper()}_GROUP").strip()
        if group:
            found[role] = group
    return found


def ldap_settings() -> dict[str, Any]:
    """The AUTH_LDAP_* settings GPUADMIN_LDAP_* describe; {} when GPUADMIN_LDAP_SERVER_URI is unset."""
    uri = env_str("GPUADMIN_LDAP_SERVER_URI").strip()
    if not uri:
        return {}
    import ldap
    from django_auth_ldap.config import GroupOfNamesType, GroupOfUniqueNamesType, LDAPSearch, PosixGroupType

    start_tls = env_bool("GPUADMIN_LDAP_START_TLS", False)
    encrypted = uri.lower().startswith("ldaps://") or start_tls
    if not encrypted and not env_bool("GPUADMIN_LDAP_ALLOW_PLAINTEXT"):
        raise ImproperlyConfigured(
            f"GPUADMIN_LDAP_SERVER_URI={uri} would send passwords in clear: use ldaps://, or set "
            "GPUADMIN_LDAP_START_TLS=1 (GPUADMIN_LDAP_ALLOW_PLAINTEXT=1 if the network is trusted)"
        )
    options: dict[int, Any] = {
        ldap.OPT_REFERRALS: 0,  # Active Directory's referrals would bind elsewhere, anonymously
        ldap.OPT_NETWORK_TIMEOUT: NETWORK_TIMEOUT_SECONDS,
        ldap.OPT_TIMEOUT: OPERATION_TIMEOUT_SECONDS,
        ldap.OPT_X_TLS_REQUIRE_CERT: ldap.OPT_X_TLS_DEMAND,
    }
    if ca_file := env_str("GPUADMIN_LDAP_CA_FILE").strip():
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    # Last: a new TLS context made of the options above (python-ldap applies them in this order).
    options[ldap.OPT_X_TLS_NEWCTX] = 0

    found: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_BIND_DN": env_str("GPUADMIN_LDAP_BIND_DN"),
        "AUTH_LDAP_BIND_PASSWORD": env_secret("GPUADMIN_LDAP_BIND_PASSWORD"),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        # Roles are gpuadmin's own groups, set from the mapping (directory.roles), never mirrored.
        "AUTH_LDAP_MIRROR_GROUPS": False,
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        "GPUADMIN_LDAP_ROLE_GROUPS": role_groups("GPUADMIN_LDAP"),
        "GPUADMIN_LDAP_USER_SEARCH_BASE": "",
        "GPUADMIN_LDAP_USER_FILTER": "",
    }
    if template := env_str("GPUADMIN_LDAP_USER_DN_TEMPLATE").strip():
        found["AUTH_LDAP_USER_DN_TEMPLATE"] = template
        # No search account: the person's own bind reads their entry and groups.
        found["AUTH_LDAP_BIND_AS_AUTHENTICATING_USER"] = True
    else:
        base = env_str("GPUADMIN_LDAP_USER_SEARCH_BASE").strip()
        if not base:
            raise ImproperlyConfigured("GPUADMIN_LDAP_SERVER_URI needs GPUADMIN_LDAP_USER_DN_TEMPLATE "
                                       "(direct bind) or GPUADMIN_LDAP_USER_SEARCH_BASE (search)")
        user_filter = env_str("GPUADMIN_LDAP_USER_FILTER").strip() or DEFAULT_USER_FILTER
        if "%(user)s" not in user_filter:
            raise ImproperlyConfigured(f"GPUADMIN_LDAP_USER_FILTER must hold %(user)s: {user_filter!r}")
        found["AUTH_LDAP_USER_SEARCH"] = LDAPSearch(base, ldap.SCOPE_SUBTREE, user_filter)
        found["GPUADMIN_LDAP_USER_SEARCH_BASE"] = base
        found["GPUADMIN_LDAP_USER_FILTER"] = user_filter
    if group_base := env_str("GPUADMIN_LDAP_GROUP_SEARCH_BASE").strip():
        group_type = env_str("GPUADMIN_LDAP_GROUP_TYPE", "groupOfNames").strip()
        types = {"groupofnames": (GroupOfNamesType, "groupOfNames"),
                 "groupofuniquenames": (GroupOfUniqueNamesType, "groupOfUniqueNames"),
                 "posixgroup": (PosixGroupType, "posixGroup")}
        if group_type.lower() not in types:
            raise ImproperlyConfigured(f"GPUADMIN_LDAP_GROUP_TYPE must be groupOfNames, groupOfUniqueNames "
                                       f"or posixGroup, not {group_type!r}")
        kind, object_class = types[group_type.lower()]
        found["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE,
                                                     f"(objectClass={object_class})")
        found["AUTH_LDAP_GROUP_TYPE"] = kind()
    elif found["GPUADMIN_LDAP_ROLE_GROUPS"]:
        raise ImproperlyConfigured("GPUADMIN_LDAP_*_GROUP needs GPUADMIN_LDAP_GROUP_SEARCH_BASE")
    return found


def oidc_settings() -> dict[str, Any]:
    """The OIDC_* settings GPUADMIN_OIDC_* describe; {} when GPUADMIN_OIDC_CLIENT_ID is unset."""
    client_id = env_str("GPUADMIN_OIDC_CLIENT_ID").strip()
    if not client_id:
        return {}
    names = {"GPUADMIN_OIDC_ISSUER": "", "GPUADMIN_OIDC_AUTHORIZATION_ENDPOINT": "",
             "GPUADMIN_OIDC_TOKEN_ENDPOINT": "", "GPUADMIN_OIDC_USERINFO_ENDPOINT": "",
             "GPUADMIN_OIDC_JWKS_ENDPOINT": ""}
    for name in names:
        names[name] = env_str(name).strip()
    if missing := [name for name, value in names.items() if not value]:
        raise ImproperlyConfigured(f"GPUADMIN_OIDC_CLIENT_ID needs {', '.join(missing)} too (docs/deploy.md)")
    ca_file = env_str("GPUADMIN_OIDC_CA_FILE").strip()
    return {
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": env_secret("GPUADMIN_OIDC_CLIENT_SECRET"),
        "OIDC_OP_AUTHORIZATION_ENDPOINT": names["GPUADMIN_OIDC_AUTHORIZATION_ENDPOINT"],
        "OIDC_OP_TOKEN_ENDPOINT": names["GPUADMIN_OIDC_TOKEN_ENDPOINT"],
        "OIDC_OP_USER_ENDPOINT": names["GPUADMIN_OIDC_USERINFO_ENDPOINT"],
        "OIDC_OP_JWKS_ENDPOINT": names["GPUADMIN_OIDC_JWKS_ENDPOINT"],
        "OIDC_RP_SIGN_ALGO": env_str("GPUADMIN_OIDC_SIGN_ALGO", "RS256"),
        "OIDC_RP_SCOPES": env_str("GPUADMIN_OIDC_SCOPES", "openid email profile"),
        "OIDC_USE_PKCE": True,
        "OIDC_USE_NONCE": True,
        # requests' verify: a CA bundle's path, or True for the system's CAs.
        "OIDC_VERIFY_SSL": ca_file or True,
        "OIDC_TIMEOUT": 10,
        "LOGIN_REDIRECT_URL_FAILURE": "/login/?directory_error=1",
        "GPUADMIN_OIDC_ISSUER": names["GPUADMIN_OIDC_ISSUER"],
        "GPUADMIN_OIDC_PROVIDER_NAME": env_str("GPUADMIN_OIDC_PROVIDER_NAME", "single sign-on"),
        "GPUADMIN_OIDC_USERNAME_CLAIM": env_str("GPUADMIN_OIDC_USERNAME_CLAIM", "preferred_username"),
        "GPUADMIN_OIDC_GROUPS_CLAIM": env_str("GPUADMIN_OIDC_GROUPS_CLAIM", "groups"),
        "GPUADMIN_OIDC_UNIX_NAME_CLAIM": env_str("GPUADMIN_OIDC_UNIX_NAME_CLAIM"),
        "GPUADMIN_OIDC_UNIX_UID_CLAIM": env_str("GPUADMIN_OIDC_UNIX_UID_CLAIM"),
        "GPUADMIN_OIDC_ROLE_GROUPS": role_groups("GPUADMIN_OIDC"),
    }


def provider_origin(settings_found: dict[str, Any]) -> str:
    """scheme://host[:port] of the authorization endpoint (for the Content-Security-Policy's form-action)."""
    parts = urlsplit(settings_found["OIDC_OP_AUTHORIZATION_ENDPOINT"])
    return f"{parts.scheme}://{parts.netloc}"


