from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("gpuadmin.api.urls")),
    path("kills/", include("gpuadmin.kills.urls")),
    path("", include("gpuadmin.web.urls")),
]
