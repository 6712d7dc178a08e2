"""The template filters that format sizes and ages, and show untrusted text safely."""

from types import SimpleNamespace

from django.template import Context, Template

from gpuadmin.web.templatetags.gpuadmin_format import (
    bytes_human,
    command_args,
    duration,
    gpu_bar,
    inline_code,
    memory_bar,
    path_breaks,
    state_name,
    visible_controls,
    visible_controls_text,
)

GiB = 1024**3


def test_size_and_age_filters_show_gpuadmin_text_and_a_dash_for_a_missing_value():
    # The formats themselves are tested in tests/test_text.py.
    assert bytes_human(12 * GiB) == "12 GiB"
    assert duration(303) == "5 min 3 s"
    for missing in (None, ""):
        assert bytes_human(missing) == duration(missing) == "—"


def test_control_characters_become_visible_escapes_in_a_marked_span():
    shown = visible_controls("a\x1b[31mb\u202ec\u200bd\te\nf\x7fg")
    assert shown == (
        'a<span class="ctl" title="control character">\\x1b</span>[31mb'
        '<span class="ctl" title="control character">\\u202e</span>c'
        '<span class="ctl" title="control character">\\u200b</span>d'
        '<span class="ctl" title="control character">\\x09</span>e'
        '<span class="ctl" title="control character">\\x0a</span>f'
        '<span class="ctl" title="control character">\\x7f</span>g'
    )


def test_markup_is_escaped_and_nothing_is_dropped():
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(1)>&'
    assert visible_controls(hostile) == (
        "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;"
    )


def test_markup_next_to_control_characters_is_still_escaped():
    assert visible_controls("<b>\x1b</b>") == (
        '&lt;b&gt;<span class="ctl" title="control character">\\x1b</span>&lt;/b&gt;'
    )


def test_escaping_holds_even_where_a_template_turns_autoescape_off():
    rendered = Template(
        "{% load gpuadmin_format %}{% autoescape off %}{{ v|visible_controls }}{% endautoescape %}"
    ).render(Context({"v": "<script>\u202e"}))
    assert rendered == '&lt;script&gt;<span class="ctl" title="control character">\\u202e</span>'


def test_characters_outside_the_basic_plane_and_invisible_spaces_are_shown():
    assert visible_controls_text("a\U000e0001b\u00a0c") == "a\\U000e0001b\\xa0c"
    assert visible_controls_text("ünïcode 日本 🙂 ok") == "ünïcode 日本 🙂 ok"


def test_text_form_is_autoescaped_in_attributes():
    rendered = Template('{% load gpuadmin_format %}<i title="{{ v|visible_controls_text }}">').render(
        Context({"v": '"><script>\x1b'})
    )
    assert rendered == '<i title="&quot;&gt;&lt;script&gt;\\x1b">'


def test_memory_bar_splits_used_memory_into_attributed_and_unattributed():
    bar = memory_bar(SimpleNamespace(index=0, memory_total_bytes=80 * GiB, memory_used_bytes=30 * GiB,
                                     memory_attributed_bytes=28 * GiB, utilization_percent=97))
    assert bar == {
        "index": "0", "attributed_percent": "35.0", "unattributed_percent": "2.5", "used_percent": "38",
        "used": "30 GiB", "total": "80 GiB", "unattributed": "2 GiB",
        "title": "GPU 0: 30 GiB used of 80 GiB; 2 GiB not attributed to any visible process; 97% busy",
    }


def test_memory_bar_never_shows_more_attributed_than_used_or_unknown_totals():
    over = memory_bar(SimpleNamespace(index=1, memory_total_bytes=10, memory_used_bytes=4,
                                      memory_attributed_bytes=9, utilization_percent=None))
    assert over["attributed_percent"] == "40.0"
    assert over["unattributed_percent"] == "0.0"
    assert over["unattributed"] == ""
    unknown = memory_bar(SimpleNamespace(index=2, memory_total_bytes=None, memory_used_bytes=None,
                                         memory_attributed_bytes=0, utilization_percent=None))
    assert unknown == {
        "index": "2", "attributed_percent": "0.0", "unattributed_percent": "0.0", "used_percent": "0",
        "used": "—", "total": "—", "unattributed": "",
        "title": "GPU 2: — used of —; 0 B not attributed to any visible process",
    }


def test_state_letters_are_named():
    assert state_name("D") == "in uninterruptible sleep (D)"
    assert state_name("Z") == "a zombie"
    assert state_name("q") == "in state q"


def gpu(index: int, used: int, attributed: int, utilization: int | None) -> SimpleNamespace:
    return SimpleNamespace(index=index, memory_total_bytes=80 * GiB, memory_used_bytes=used,
                           memory_attributed_bytes=attributed, utilization_percent=utilization)


def test_a_gpu_bar_draws_both_parts_and_names_unattributed_memory_only_when_there_is_some():
    busy = gpu_bar(memory_bar(gpu(0, 30 * GiB, 28 * GiB, 97)))
    assert busy == (
        '<div class="gpu-line" title="GPU 0: 30 GiB used of 80 GiB; 2 GiB not attributed to any'
        ' visible process; 97% busy"><span class="small">GPU 0</span>'
        '<svg class="bar" role="img" aria-label="38% used">'
        '<rect class="bar-attributed" width="35.0%" height="100%"/>'
        '<rect class="bar-unattributed" x="35.0%" width="2.5%" height="100%"/></svg>'
        '<span class="mono small">30 GiB / 80 GiB'
        ' <span class="unattributed">(2 GiB unattributed)</span></span>'
        "</div>"
    )
    clean = gpu_bar(memory_bar(gpu(1, 8 * GiB, 8 * GiB, None)))
    assert '<span class="mono small">8 GiB / 80 GiB</span>' in clean
    assert "unattributed)" not in clean


def test_a_gpu_bar_escapes_what_it_is_given():
    bar = {"index": "<b>", "attributed_percent": "1", "unattributed_percent": "2", "used_percent": "3",
           "used": "&", "total": '"', "unattributed": "<i>", "title": "'\"<>"}
    shown = gpu_bar(bar)
    assert "<b>" not in shown and "<i>" not in shown
    assert 'title="&#x27;&quot;&lt;&gt;"' in shown
    assert "&amp; / &quot; <span class=\"unattributed\">(&lt;i&gt; unattributed)</span>" in shown


def test_a_command_line_breaks_only_between_its_arguments_each_escaped():
    process = SimpleNamespace(cmdline=("python", "<b>x</b>", "--lr=3e-4"), command_line="unused")
    assert command_args(process) == (
        '<span class="cmdline"><span class="arg">python</span> <wbr><span class="arg">&lt;b&gt;x&lt;/b&gt;'
        '</span> <wbr><span class="arg">--lr=3e-4</span></span>'
    )
    # A kernel thread (no argv) shows its name; plain text splits at its spaces.
    assert command_args(SimpleNamespace(cmdline=(), command_line="[kworker]")) == (
        '<span class="cmdline"><span class="arg">[kworker]</span></span>')
    assert '<span class="ctl"' in command_args("a \x1b")


def test_api_paths_break_after_slashes_and_backticks_become_code():
    assert path_breaks("/api/v1/<id>/") == "/<wbr>api/<wbr>v1/<wbr>&lt;id&gt;/<wbr>"
    assert inline_code("use `GET /x` or <b>") == "use <code>GET /x</code> or &lt;b&gt;"


def test_a_moment_is_24_hour_in_the_labs_zone_with_its_age_beside_and_the_full_time_on_hover(settings):
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    from gpuadmin.text import utc_text
    from gpuadmin.web.templatetags.gpuadmin_format import clock_ms, moment

    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+05:30, no daylight saving
    four_minutes_ago = timezone.now() - timedelta(minutes=4, seconds=2)
    local = timezone.localtime(four_minutes_ago)
    shown = moment(four_minutes_ago)
    date = "" if local.date() == timezone.localdate() else f"{local:%Y-%m-%d} "
    assert shown.startswith(f'<time class="moment" datetime="{utc_text(four_minutes_ago)}" '
                            f'title="{local:%Y-%m-%d %H:%M:%S} IST">{date}{local:%H:%M} ')
    assert '<span class="age">(4 min ago)</span></time>' in shown
    # Another day shows its date; the history API's ISO text is read too; a kill's steps to the ms.
    old = datetime(2026, 1, 2, 22, 45, 1, 250000, tzinfo=UTC)
    assert ">2026-01-03 04:15 <span" in moment(old) and 'title="2026-01-03 04:15:01 IST"' in moment(old)
    assert moment("2026-01-02T22:45:01Z") == moment(old.replace(microsecond=0))
    assert ">04:15:01.250</time>" in clock_ms(old)
    assert moment(None) == moment("not a time") == "—"


def test_ages_are_worded_in_their_largest_unit():
    from gpuadmin.text import human_age

    assert [human_age(s) for s in (2, 54, 250, 7300, 200000, -300)] == [
        "just now", "54 s ago", "4 min ago", "2 h ago", "2 d ago", "in 5 min"]
