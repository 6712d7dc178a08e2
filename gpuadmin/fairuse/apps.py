from django.apps import AppConfig


class FairUseConfig(AppConfig):
    name = "gpuadmin.fairuse"
    label = "fairuse"
    verbose_name = "Fair use"
    default_auto_field = "django.db.models.BigAutoField"
