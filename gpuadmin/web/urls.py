from django.urls import path

from gpuadmin.web import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    # Anyone may fetch the icon (no login): browsers ask before any page says where it is.
    path("favicon.ico", views.favicon, name="favicon"),
    path("hosts/<str:name>/", views.host_detail, name="host_detail"),
    path("hosts/<str:name>/probe/", views.host_probe, name="host_probe"),
    path("hosts/<str:name>/accept/", views.host_accept, name="host_accept"),
    path("hosts-awaiting/clear/", views.awaiting_hosts_clear, name="awaiting_hosts_clear"),
    path(
        "hosts/<str:name>/processes/<int:pid>-<int:start_time_ticks>/",
        views.process_detail,
        name="process_detail",
    ),
]
