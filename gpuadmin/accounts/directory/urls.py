"""OpenID Connect's pages: the sign-in link, the provider's callback, re-authentication."""

from django.urls import path

from gpuadmin.accounts.directory import oidc

urlpatterns = [
    path("authenticate/", oidc.sign_in, name="oidc_authentication_init"),
    path("callback/", oidc.callback, name="oidc_authentication_callback"),
    path("reauthenticate/", oidc.reauthenticate, name="oidc_reauthenticate"),
]
