from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from gpuadmin.accounts.views import reauthenticate
from gpuadmin.metrics import metrics_view
from gpuadmin.web.api_docs import api_docs
from gpuadmin.web.health import healthz

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Password again before approving ("sudo mode", gpuadmin/accounts/sudo.py).
    path("reauthenticate/", reauthenticate, name="reauthenticate"),
    # Sign-in and re-authentication through the lab's OpenID Connect provider (404 when none is set).
    path("oidc/", include("gpuadmin.accounts.directory.urls")),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),  # Prometheus, bearer token (gpuadmin/metrics.py)
    path("healthz", healthz, name="healthz"),  # no login: for process managers and load balancers
    # JSON API, one module per app that owns the data.
    path("api/v1/", include("gpuadmin.fleet.api_urls")),
    path("api/v1/", include("gpuadmin.kills.api_urls")),
    path("api/v1/", include("gpuadmin.audit.api_urls")),
    path("api/v1/", include("gpuadmin.usage.api_urls")),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api_schema"),
    path("api/v1/docs/", api_docs, name="api_docs"),  # the schema as a page, no script (web/api_docs.py)
    # Pages.
    path("kills/", include("gpuadmin.kills.urls")),
    path("audit/", include("gpuadmin.audit.urls")),
    path("notifications/", include("gpuadmin.notify.urls")),
    path("", include("gpuadmin.fairuse.urls")),  # /me/gpus/ and fair use's pages
    path("usage/", include("gpuadmin.usage.urls")),
    path("", include("gpuadmin.web.urls")),
]
