from django.apps import AppConfig


class KillsConfig(AppConfig):
    name = "gpuadmin.kills"
    verbose_name = "Kill requests"
