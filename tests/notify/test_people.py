"""Who owns uid 1000 on gpu07: accounts per host or fleet-wide, Slurm before unix for a job, CSV import."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from gpuadmin.fleet.models import Host
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Account, Person
from tests.factories import GiB, gpu, proc, slurm_owner
from tests.fleet.helpers import store
from tests.notify.helpers import person

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu07(db) -> Host:
    return store("gpu07", gpus=[gpu(0, used=4 * GiB)], processes=[
        proc(10, uid=1000, user="alice", gpu_memory={"GPU-sim-0000": GiB}),
        proc(11, uid=1001, user=None, gpu_memory={"GPU-sim-0000": GiB}),
        proc(12, uid=1002, user="jobuser", owner=slurm_owner("77", uid=1002),
             gpu_memory={"GPU-sim-0000": GiB}),
    ])


def test_a_host_mapping_wins_over_a_fleet_wide_one(gpu07):
    everywhere = person("Alice Everywhere", unix="alice")
    here = person("Alice on gpu07")
    Account.objects.create(person=here, uid=1000, host=gpu07)
    assert Directory.for_host(gpu07).person_for(uid=1000, user="alice") == here
    assert Directory.for_host(None).person_for(uid=1000, user="alice") == everywhere


def test_the_directories_of_many_hosts_from_one_query_answer_as_each_hosts_own(
    gpu07, django_assert_num_queries
):
    gpu08 = store("gpu08", gpus=[gpu(0)], processes=[])
    everywhere = person("Alice Everywhere", unix="alice")
    here = person("Alice on gpu07")
    Account.objects.create(person=here, uid=1000, host=gpu07)
    Account.objects.create(person=person("Bob on gpu08"), uid=1001, host=gpu08)
    with django_assert_num_queries(1):
        directories = Directory.for_hosts([gpu07, gpu08])
    for host in (gpu07, gpu08):
        alone = Directory.for_host(host)
        assert directories[host.pk].accounts == alone.accounts
        for uid, user in ((1000, "alice"), (1001, None), (1009, "alice")):
            assert directories[host.pk].person_for(uid=uid, user=user) == alone.person_for(uid=uid, user=user)
    assert directories[gpu07.pk].person_for(uid=1000, user="alice") == here
    assert directories[gpu08.pk].person_for(uid=1000, user="alice") == everywhere


def test_a_uid_without_a_name_is_found_by_uid(gpu07):
    someone = person("Uid Only")
    Account.objects.create(person=someone, uid=1001)
    assert Directory.for_host(gpu07).person_for(uid=1001, user=None) == someone
    assert Directory.for_host(gpu07).person_for(uid=1009, user=None) is None


def test_a_slurm_account_wins_for_a_processes_of_a_job(gpu07):
    unix = person("Unix Name", unix="jobuser")
    slurm = person("Slurm Name")
    Account.objects.create(person=slurm, kind=Account.Kind.SLURM, uid=1002)
    directory = Directory.for_host(gpu07)
    assert directory.person_for(uid=1002, user="jobuser", owner=slurm_owner("77", uid=1002)) == slurm
    assert directory.person_for(uid=1002, user="jobuser") == unix


def test_the_host_page_shows_the_person_next_to_the_user(gpu07, viewer_client):
    person("Alice Liddell", unix="alice")
    page = viewer_client.get(reverse("host_detail", args=["gpu07"])).content.decode()
    row = re.search(r'<tr id="[^"]*" data-pid="10">.*?</tr>', page, re.S).group(0)
    assert '<span class="small person">Alice Liddell</span>' in row
    assert "person" not in re.search(r'<tr id="[^"]*" data-pid="11">.*?</tr>', page, re.S).group(0)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "people.csv"
    path.write_text(text)
    return path


CSV = """name,email,kind,account,host,panel_user,notification_urls
Alice Liddell,alice@lab.example,unix,alice,,vera,
Alice Liddell,alice@lab.example,unix,1000,gpu07,,json://hooks.lab.example/alice
Bob,bob@lab.example,slurm,bob,,,
"""


def test_import_maps_accounts_to_people_and_links_panel_users(gpu07, viewer, tmp_path):
    call_command("import_people", str(write(tmp_path, CSV)))
    alice = Person.objects.get(email="alice@lab.example")
    assert alice.user == viewer
    assert alice.apprise_urls() == ["djangomail://alice@lab.example", "json://hooks.lab.example/alice"]
    assert {(a.kind, a.name, a.uid, a.host_id) for a in alice.accounts.all()} == {
        ("unix", "alice", None, None), ("unix", "", 1000, gpu07.pk),
    }
    assert Person.objects.get(email="bob@lab.example").accounts.get().kind == "slurm"


def test_importing_the_same_file_again_changes_nothing(gpu07, viewer, tmp_path):
    path = write(tmp_path, CSV)
    call_command("import_people", str(path))
    call_command("import_people", str(path))
    assert Person.objects.count() == 2 and Account.objects.count() == 3
    assert Person.objects.get(name="Alice Liddell").notification_urls == "json://hooks.lab.example/alice"


@pytest.mark.parametrize(("line", "message"), [
    ("Carol,carol@lab.example,unix,carol,gpu99,,", "line 3: no host named 'gpu99'"),
    ("Carol,not-an-email,unix,carol,,,", "line 3: 'not-an-email' is not an email address"),
    ("Carol,carol@lab.example,ldap,carol,,,", "line 3: kind must be one of unix, slurm"),
    ("Carol,carol@lab.example,unix,carol,,nobody,", "line 3: no panel account named 'nobody'"),
])
def test_a_bad_line_is_named_and_nothing_is_imported(gpu07, tmp_path, line, message):
    path = write(tmp_path, "name,email,kind,account,host,panel_user,notification_urls\n"
                           f"Dave,dave@lab.example,unix,dave,,,\n{line}\n")
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("import_people", str(path))
    assert Person.objects.count() == 0


def test_a_dry_run_stores_nothing(gpu07, viewer, tmp_path, capsys):
    call_command("import_people", str(write(tmp_path, CSV)), "--dry-run")
    assert "would add 2 people, 3 accounts" in capsys.readouterr().out
    assert Person.objects.count() == 0


# Not "page": that name is pytest-playwright's fixture, and would make this a browser test.
@pytest.mark.parametrize("admin_page", [
    "admin:notify_person_changelist", "admin:notify_person_add", "admin:notify_account_changelist",
    "admin:notify_notification_changelist",
])
def test_people_and_notifications_have_admin_pages(admin_client, admin_page):
    assert admin_client.get(reverse(admin_page)).status_code == 200


def test_a_person_chooses_what_they_receive_on_their_preferences_page(viewer, viewer_client, inbox):
    url = reverse("notification_preferences")
    assert viewer_client.get(url).status_code == 200
    response = viewer_client.post(url, {
        "email": "vera@lab.example", "notification_urls": f"  {inbox.url('vera')}  \n\n",
        "notify_my_requests": "on",
    })
    assert response.status_code == 302
    vera = Person.objects.get(user=viewer)
    assert vera.email == "vera@lab.example"
    assert vera.notification_urls == inbox.url("vera")
    assert (vera.notify_requests_to_approve, vera.notify_my_requests, vera.notify_my_processes) == (
        False, True, False
    )


def test_a_url_apprise_cannot_use_is_refused(viewer_client):
    response = viewer_client.post(reverse("notification_preferences"),
                                  {"email": "", "notification_urls": "nosuchservice://x"})
    assert response.status_code == 400
    assert "Not a notification URL Apprise understands" in response.content.decode()


def test_the_preferences_page_needs_a_login(client):
    assert client.get(reverse("notification_preferences")).status_code == 302
