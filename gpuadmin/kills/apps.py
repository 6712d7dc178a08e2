from django.apps import AppConfig


class KillsConfig(AppConfig):
    name = "gpuadmin.kills"
    verbose_name = "Kill requests"

    def ready(self) -> None:
        from gpuadmin.fleet.signals import snapshot_ingested
        from gpuadmin.kills.services.released import on_snapshot_ingested

        snapshot_ingested.connect(on_snapshot_ingested, dispatch_uid="kills.memory_released")
