from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "gpuadmin.usage"
    verbose_name = "GPU usage"

    def ready(self) -> None:
        from gpuadmin.fleet.signals import snapshot_storing, snapshot_updates_storing
        from gpuadmin.usage import ledger

        snapshot_storing.connect(ledger.on_snapshot_storing, dispatch_uid="usage.on_snapshot_storing")
        snapshot_updates_storing.connect(ledger.on_snapshot_updates_storing,
                                         dispatch_uid="usage.on_snapshot_updates_storing")
