from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "gpuadmin.accounts"
    verbose_name = "Accounts and roles"

    def ready(self) -> None:
        from gpuadmin.accounts import audit_trail, sudo

        audit_trail.connect()
        sudo.connect()
