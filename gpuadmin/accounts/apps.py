import contextlib

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "gpuadmin.accounts"
    verbose_name = "Accounts and roles"

    def ready(self) -> None:
        from gpuadmin.accounts import audit_trail, sudo

        audit_trail.connect()
        sudo.connect()
        # LDAP sign-in is an extra (python-ldap builds against libldap): without it, nothing to connect.
        with contextlib.suppress(ImportError):
            from gpuadmin.accounts.directory import ldap

            ldap.connect()
