"""Template filters for what the pages show: bytes, ages and process states
(one-line wrappers of ``gpuadmin.text``), times (``moment``: 24-hour in the lab's
zone, how long ago beside, the full time on hover), roles, audit
sentences, and untrusted text from processes made visible instead of
interpreted (see untrusted_text.py).

Anything that comes from a GPU host (command line, process name, user name,
container id) is chosen by whoever runs the process there: show it through
``visible_controls`` (or ``visible_controls_text`` inside an attribute).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from gpuadmin.accounts.roles import Role, role_names
from gpuadmin.audit import sentences
from gpuadmin.text import human_age, human_bytes, human_duration, process_state, utc_text
from gpuadmin.untrusted_text import visible_text, visible_text_parts

register = template.Library()

# Formatting lives in gpuadmin.text; these filters only adapt it to templates, where a
# missing value arrives as "".


@register.filter
def state_name(letter: Any) -> str:
    return process_state(str(letter))


@register.filter
def bytes_human(value: Any) -> str:
    return human_bytes(None if value == "" else value)


@register.filter
def duration(value: Any) -> str:
    return human_duration(None if value == "" else value)


@register.filter(is_safe=False)
def visible_controls(value: Any) -> SafeString:
    """Escape ``value`` for HTML and show its control characters as marked escapes.

    The result is built only from ``conditional_escape``d pieces and fixed
    markup, so it is safe whatever the input; it is escaped even where a
    template turned auto-escaping off, because the input is never trusted.
    """
    if value is None:
        return mark_safe("")
    text = str(value)
    if text.isprintable():
        # No control character to mark (most text): escaped at once.
        return conditional_escape(text)
    out: list[str] = []
    for is_control, piece in visible_text_parts(text):
        if is_control:
            out.append(format_html('<span class="ctl" title="control character">{}</span>', piece))
        else:
            out.append(conditional_escape(piece))
    return mark_safe("".join(out))  # noqa: S308 - every piece above is escaped


@register.filter
def visible_controls_text(value: Any) -> str:
    """Plain-text form of ``visible_controls`` for attributes (title=...): escapes as text, auto-escaped."""
    return "" if value is None else visible_text(str(value))


@register.filter
def role_label(user: Any) -> str:
    """The user's roles in the order viewer, requester, approver: 'viewer, requester'."""
    names = role_names(user)
    return ", ".join(r.value for r in Role if r.value in names)


@register.filter
def percent_of(part: Any, whole: Any) -> float:
    """part / whole as a percentage clamped to 0..100, for bar widths (0 when unknown)."""
    try:
        ratio = 100.0 * float(part) / float(whole)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return max(0.0, min(100.0, ratio))


@register.filter
def of_gpu(by_uuid: Any, gpu: Any) -> Any:
    """What a mapping keyed by GPU uuid holds for this GPU (the host page's MIG instances); () if nothing."""
    return by_uuid.get(gpu.uuid, ()) if hasattr(by_uuid, "get") else ()


@register.filter
def memory_bar(gpu: Any) -> dict[str, str]:
    """Everything a GPU memory bar shows, formatted once (the fleet page draws one per GPU).

    The bar has two parts, attributed then unattributed memory. Attributed is
    capped at used: the two are read at slightly different moments, and the bar
    must never claim more than the GPU reports.
    """
    total = getattr(gpu, "memory_total_bytes", None)
    used_bytes = getattr(gpu, "memory_used_bytes", None)
    used = used_bytes or 0
    attributed = min(getattr(gpu, "memory_attributed_bytes", 0) or 0, used)
    unattributed = used - attributed
    attributed_percent = percent_of(attributed, total)
    unattributed_percent = min(percent_of(unattributed, total), 100.0 - attributed_percent)
    utilization = getattr(gpu, "utilization_percent", None)
    used_text, total_text = human_bytes(used_bytes), human_bytes(total)
    unattributed_text = human_bytes(unattributed)
    title = (
        f"GPU {gpu.index}: {used_text} used of {total_text}; "
        f"{unattributed_text} not attributed to any visible process"
    )
    if utilization is not None:
        title += f"; {utilization}% busy"
    return {
        "index": str(gpu.index),
        "attributed_percent": f"{attributed_percent:.1f}",
        "unattributed_percent": f"{unattributed_percent:.1f}",
        "used_percent": f"{percent_of(used, total):.0f}",
        "used": used_text,
        "total": total_text,
        "unattributed": unattributed_text if unattributed else "",
        "title": title,
    }


# One GPU's memory bar. It has one width everywhere (static/css/gpuadmin.css, .bar), so every
# GPU is drawn on the same scale, its figures beside it. SVG lengths, not style attributes: the
# Content-Security-Policy allows no inline style. Markup built here, not by an included template:
# the fleet page draws 400 of them, and an {% include %} would resolve a template and its context
# for each.
_GPU_BAR = (
    '<div class="gpu-line" title="{title}">'
    '<span class="small">GPU {index}</span>'
    '<svg class="bar" role="img" aria-label="{used_percent}% used">'
    '<rect class="bar-attributed" width="{attributed_percent}%" height="100%"/>'
    '<rect class="bar-unattributed" x="{attributed_percent}%" width="{unattributed_percent}%" height="100%"/>'
    "</svg>"
    '<span class="mono small">{used} / {total}{unattributed}</span>'
    "</div>"
)
_GPU_BAR_UNATTRIBUTED = ' <span class="unattributed">({} unattributed)</span>'


@register.filter
def gpu_bar(bar: dict[str, str]) -> SafeString:
    """One GPU's memory bar from ``memory_bar``'s dict: the fixed markup above, every value escaped."""
    unattributed = format_html(_GPU_BAR_UNATTRIBUTED, bar["unattributed"]) if bar["unattributed"] else ""
    return format_html(_GPU_BAR, **{**bar, "unattributed": unattributed})


# Fixed markup only: where a line may break (every value around it goes through format_html).
_BREAK_AFTER_SPACE = mark_safe(" <wbr>")
_BREAK_AFTER_SLASH = mark_safe("/<wbr>")
_ARG = '<span class="arg">{}</span>'


@functools.lru_cache(maxsize=256)
def repeated_format(item: str, separator: str, count: int) -> str:
    """The format string of ``count`` items written as ``item`` (fixed markup with ``{}`` fields),
    ``separator`` between them: a list's values filled in by one ``format_html``, which escapes each,
    instead of a ``format_html`` per item (the host page's table writes thousands). Fixed markup only:
    the values are never part of the format string."""
    return separator.join([item] * count)


@register.filter
def command_args(process: Any) -> SafeString:
    """A command line that breaks only between its arguments: each argument a ``span.arg`` (an
    inline block, so a line breaks inside one only when it is wider than the line), a space and
    ``<wbr>`` between. ``process``: anything with ``cmdline`` (argv) and ``command_line``, or text."""
    argv = getattr(process, "cmdline", None)
    if not argv:
        argv = str(getattr(process, "command_line", process) or "").split(" ")
    fields = repeated_format(_ARG, _BREAK_AFTER_SPACE, len(argv))
    return format_html(f'<span class="cmdline">{fields}</span>', *[visible_controls(arg) for arg in argv])


@register.filter
def path_breaks(path: Any) -> SafeString:
    """A URL path that may break only after its slashes on a narrow screen: ``/api/<wbr>v1/<wbr>...``."""
    return format_html_join(_BREAK_AFTER_SLASH, "{}", ((part,) for part in str(path).split("/")))


@register.filter
def inline_code(text: Any) -> SafeString:
    """Our own prose (API descriptions) with its `backticks` as ``<code>``; everything escaped."""
    pieces = str(text or "").split("`")
    out = [format_html("<code>{}</code>", piece) if i % 2 else conditional_escape(piece)
           for i, piece in enumerate(pieces)]
    return mark_safe("".join(out))  # noqa: S308 - every piece escaped


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return value if isinstance(value, datetime) and value.tzinfo is not None else None


_MOMENT = '<time class="{}" datetime="{}" title="{}">{}{} <span class="age">({})</span></time>'


def _moment_html(value: Any, *, css: str, prefix: str = "") -> SafeString:
    value = _as_datetime(value)
    if value is None:
        return mark_safe("—")
    local = timezone.localtime(value)
    shown = local.strftime("%H:%M" if local.date() == timezone.localdate() else "%Y-%m-%d %H:%M")
    title = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
    age = human_age((timezone.now() - value).total_seconds())
    return format_html(_MOMENT, css, utc_text(value), title, prefix, shown, age)


@register.filter
def moment(value: Any) -> SafeString:
    """A time, the one way pages show one: 24-hour in the lab's zone (settings.TIME_ZONE, from
    GPUADMIN_TIME_ZONE), the date only when not today, how long ago beside it, and the full time
    with seconds and zone on hover: ``<time datetime title>14:05 <span class="age">(4 min ago)</span>``.
    ``value``: a datetime, or ISO 8601 text as the history API writes it. static/js/ages.js keeps
    the age current on a page left open."""
    return _moment_html(value, css="moment")


@register.filter
def as_of(value: Any) -> SafeString:
    """When data that is no longer current was taken (an offline host's): "as of 02:13 (4 min ago)",
    a ``moment`` marked stale; "never seen" when there is no time."""
    if _as_datetime(value) is None:
        return mark_safe('<span class="stale-as-of">never seen</span>')
    return _moment_html(value, css="moment stale-as-of", prefix="as of ")


@register.filter
def clock_ms(value: Any) -> SafeString:
    """A moment of a kill's timeline to the millisecond, 24-hour in the lab's zone, full on hover."""
    value = _as_datetime(value)
    if value is None:
        return mark_safe("—")
    local = timezone.localtime(value)
    return format_html('<time datetime="{}" title="{}">{}</time>', utc_text(value),
                       f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}",
                       f"{local:%H:%M:%S}.{local.microsecond // 1000:03d}")


@register.filter
def sentence_html(sentence: Iterable[sentences.Part]) -> SafeString:
    """An audit sentence (gpuadmin.audit.sentences) as HTML: our words escaped, every value from a
    person or process through ``visible_controls``, times through ``moment``, links kept."""
    out: list[str] = []
    for part in sentence:
        if part.kind == sentences.TIME:
            html = moment(part.moment)
        elif part.kind == sentences.QUOTE:
            html = format_html('<q class="said">{}</q>', visible_controls(part.text))
        elif part.kind == sentences.NOTE:
            html = format_html(' <span class="agent-said">— {}</span>', visible_controls(part.text))
        elif part.kind == sentences.CODE:
            html = format_html("<code>{}</code>", part.text)
        elif part.untrusted:
            html = visible_controls(part.text)
        else:
            html = conditional_escape(part.text)
        out.append(format_html('<a href="{}">{}</a>', part.url, html) if part.url else html)
    return mark_safe("".join(out))  # noqa: S308 - every piece above is escaped


@register.filter
def audit_sentence(event: Any) -> SafeString:
    """The event's sentence as HTML: the one ``sentences.described`` set (one context shared by a
    page of events), else one described alone."""
    sentence = getattr(event, "sentence", None) or sentences.described([event])[0].sentence
    return sentence_html(sentence)
