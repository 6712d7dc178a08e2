from django.urls import path

from gpuadmin.kills import views

urlpatterns = [
    path("", views.kill_requests, name="kill_requests"),
    path("new/", views.kill_request_new, name="kill_request_new"),
    path("reset/new/", views.gpu_reset_request_new, name="gpu_reset_request_new"),
    path("<int:pk>/", views.kill_request_detail, name="kill_request_detail"),
    path("<int:pk>/timeline/", views.kill_request_timeline, name="kill_request_timeline"),
    path("<int:pk>/approve/", views.kill_request_approve, name="kill_request_approve"),
    path("<int:pk>/reject/", views.kill_request_reject, name="kill_request_reject"),
    path("<int:pk>/cancel/", views.kill_request_cancel, name="kill_request_cancel"),
]
