"""What the login page offers besides the password: ``{% oidc_provider_name as name %}``."""

from __future__ import annotations

from django import template

register = template.Library()


@register.simple_tag
def oidc_provider_name() -> str:
    """The OpenID Connect provider's name for its button; "" when none is configured."""
    from gpuadmin.accounts.directory import oidc

    return oidc.provider_name()
