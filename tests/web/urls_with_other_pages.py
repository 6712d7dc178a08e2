"""The real URLs plus stand-ins for pages other apps provide, so links to them are tested
whether or not those apps have their pages yet. Tests reverse the names, so they hold
whichever pattern Django picks when both exist."""

from django.http import HttpResponse
from django.urls import path

from gpuadmin.urls import urlpatterns as real_urlpatterns


def _stand_in(request, **kwargs):  # pragma: no cover - only linked to, never fetched
    return HttpResponse("stand-in")


urlpatterns = [
    path("stand-in/kills/new/", _stand_in, name="kill_request_new"),
    path("stand-in/kills/", _stand_in, name="kill_requests"),
    path("stand-in/audit/", _stand_in, name="audit_log"),
    *real_urlpatterns,
]
