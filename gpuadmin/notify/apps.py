from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "gpuadmin.notify"
    verbose_name = "People and notifications"

    def ready(self) -> None:
        from gpuadmin.accounts.credential_changes import credentials_changed
        from gpuadmin.kills.signals import kill_request_event
        from gpuadmin.notify import receivers

        kill_request_event.connect(
            receivers.on_kill_request_event, dispatch_uid="notify.on_kill_request_event"
        )
        credentials_changed.connect(
            receivers.on_credentials_changed, dispatch_uid="notify.on_credentials_changed"
        )
