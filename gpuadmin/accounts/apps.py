from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "gpuadmin.accounts"
    verbose_name = "Accounts and roles"
