from django.urls import path

from gpuadmin.web import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("hosts/<str:name>/", views.host_detail, name="host_detail"),
    path("hosts/<str:name>/probe/", views.host_probe, name="host_probe"),
    path("hosts/<str:name>/accept/", views.host_accept, name="host_accept"),
]
