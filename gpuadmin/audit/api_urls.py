from django.urls import path, re_path

from gpuadmin.audit import api

urlpatterns = [
    path("audit/", api.AuditEventList.as_view(), name="api_audit_list"),
    # Documented without a trailing slash; accept one too.
    re_path(r"^audit/verify/?$", api.AuditVerify.as_view(), name="api_audit_verify"),
]
