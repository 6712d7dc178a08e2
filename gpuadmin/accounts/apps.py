from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "gpuadmin.accounts"
    verbose_name = "Accounts and roles"

    def ready(self) -> None:
        from gpuadmin.accounts import audit_trail, sudo

        audit_trail.connect()
        sudo.connect()
        # LDAP sign-in's receiver is connected by its backend when Django's auth first loads it
        # (directory.ldap.DirectoryLDAPBackend): django-auth-ldap and python-ldap are not imported by
        # every process that loads the apps, only where LDAP signs people in.
