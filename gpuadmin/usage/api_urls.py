from django.urls import path

from gpuadmin.usage import api

urlpatterns = [
    path("usage/", api.usage, name="api_usage"),
]
