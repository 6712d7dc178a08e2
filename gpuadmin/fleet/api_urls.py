from django.urls import path

from gpuadmin.fleet import api

urlpatterns = [
    path("hosts/", api.hosts, name="api_hosts"),
    path("hosts/<str:name>/", api.host_detail, name="api_host_detail"),
    path("hosts/<str:name>/history/", api.host_history, name="api_host_history"),
    path(
        "hosts/<str:name>/processes/<int:pid>-<int:start_time_ticks>/",
        api.process_detail,
        name="api_process_detail",
    ),
]
