from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "gpuadmin.fleet"
    verbose_name = "Fleet"
