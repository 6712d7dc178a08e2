"""{% supervised as s %}: the `make run` supervisor's start time and restart count, for the footer."""

from __future__ import annotations

from django import template

from gpuadmin.web.health import Supervised, supervised

register = template.Library()


@register.simple_tag(name="supervised")
def supervised_tag() -> Supervised | None:
    return supervised()
