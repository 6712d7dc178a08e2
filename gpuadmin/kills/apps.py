from django.apps import AppConfig


class KillsConfig(AppConfig):
    name = "gpuadmin.kills"
    verbose_name = "Kill requests"

    def ready(self) -> None:
        from gpuadmin.accounts import sudo
        from gpuadmin.fleet.signals import snapshot_ingested
        from gpuadmin.kills import receivers, views

        snapshot_ingested.connect(receivers.on_snapshot_ingested, dispatch_uid="kills.on_snapshot_ingested")
        sudo.register_intent(views.APPROVE_INTENT, views.finish_approval_intent)
