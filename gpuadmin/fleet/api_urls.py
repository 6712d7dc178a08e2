from django.urls import path

from gpuadmin.fleet import api

urlpatterns = [
    path("hosts/", api.hosts, name="api_hosts"),
    path("hosts/<str:name>/", api.host_detail, name="api_host_detail"),
]
