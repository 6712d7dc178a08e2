from django.urls import path

from gpuadmin.usage import views

urlpatterns = [
    path("", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage_csv"),
    path("processes/", views.usage_processes, name="usage_processes"),
]
