from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "gpuadmin.web"
    verbose_name = "Web pages"
