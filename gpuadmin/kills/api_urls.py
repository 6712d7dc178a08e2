from django.urls import path, re_path

from gpuadmin.kills import api

urlpatterns = [
    path("kill-requests/", api.kill_requests, name="api_kill_requests"),
    path("kill-requests/preview", api.kill_request_preview, name="api_kill_request_preview"),
    path("kill-requests/<int:pk>/", api.kill_request_detail, name="api_kill_request_detail"),
    # Actions answer with or without the trailing slash: scripts write both.
    re_path(r"^kill-requests/(?P<pk>[0-9]+)/approve/?$", api.approve, name="api_kill_request_approve"),
    re_path(r"^kill-requests/(?P<pk>[0-9]+)/reject/?$", api.reject, name="api_kill_request_reject"),
    re_path(r"^kill-requests/(?P<pk>[0-9]+)/cancel/?$", api.cancel, name="api_kill_request_cancel"),
]
