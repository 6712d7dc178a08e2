from django.urls import path

from gpuadmin.audit import views

urlpatterns = [
    path("", views.audit_log, name="audit_log"),
    path("export.csv", views.audit_export_csv, name="audit_export_csv"),
    path("events/<int:sequence>/", views.audit_event, name="audit_event"),
]
