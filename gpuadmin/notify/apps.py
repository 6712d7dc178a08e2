from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "gpuadmin.notify"
    verbose_name = "People and notifications"

    def ready(self) -> None:
        from gpuadmin.kills.signals import kill_request_event
        from gpuadmin.notify import receivers

        kill_request_event.connect(
            receivers.on_kill_request_event, dispatch_uid="notify.on_kill_request_event"
        )
