from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "gpuadmin.audit"
    verbose_name = "Audit log"
