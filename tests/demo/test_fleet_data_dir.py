"""`manage.py demo_fleet` finds the demo's data directory, or says exactly what to set (issue 33)."""

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core import management

from gpuadmin.data_dir import BASE_DIR, SQLITE_DATABASE
from gpuadmin.demo import fleet_data_dir
from gpuadmin.demo.fleet_data_dir import NoDataDir, choose


def with_database(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SQLITE_DATABASE).write_bytes(b"")
    return folder


def test_the_running_demos_directory_is_chosen_when_none_is_named(tmp_path):
    demo = with_database(tmp_path / "var" / "demo")
    environ: dict[str, str] = {}
    said = choose(environ, demo_dir=demo, default_dir=tmp_path / "var")
    assert environ["GPUADMIN_DATA_DIR"] == str(demo)
    assert said == (f"demo_fleet: writing to the demo's data directory {demo} "
                    "(set GPUADMIN_DATA_DIR to write to another)")


def test_a_named_directory_or_postgresql_is_left_alone(tmp_path):
    demo = with_database(tmp_path / "demo")
    named = {"GPUADMIN_DATA_DIR": "/srv/gpuadmin"}
    assert choose(named, demo_dir=demo) is None
    assert named == {"GPUADMIN_DATA_DIR": "/srv/gpuadmin"}
    postgres = {"DATABASE_URL": "postgres://central/gpuadmin"}
    assert choose(postgres, demo_dir=demo) is None
    assert "GPUADMIN_DATA_DIR" not in postgres


def test_without_a_demo_the_default_directory_is_used(tmp_path):
    environ: dict[str, str] = {}
    assert choose(environ, demo_dir=tmp_path / "demo", default_dir=with_database(tmp_path / "var")) is None
    assert environ == {}


def test_with_neither_it_says_what_to_run_or_set(tmp_path):
    with pytest.raises(NoDataDir) as missing:
        choose({}, demo_dir=tmp_path / "var" / "demo", default_dir=tmp_path / "var")
    assert "start `make demo`" in str(missing.value)
    assert "or set GPUADMIN_DATA_DIR to the data directory of the running panel" in str(missing.value)


def manage_py() -> Any:
    spec = importlib.util.spec_from_file_location("manage", BASE_DIR / "manage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manage_py_says_it_in_one_line_instead_of_a_traceback(monkeypatch):
    def nothing_to_write_to(environ: Any) -> str:
        raise NoDataDir("demo_fleet: no data directory with a database: start `make demo` ...")

    ran: list[list[str]] = []
    monkeypatch.setattr(fleet_data_dir, "choose", nothing_to_write_to)
    monkeypatch.setattr(management, "execute_from_command_line", ran.append)
    monkeypatch.setattr(sys, "argv", ["manage.py", "demo_fleet", "--hosts", "200"])
    with pytest.raises(SystemExit) as exited:
        manage_py().main()
    assert exited.value.code == "demo_fleet: no data directory with a database: start `make demo` ..."
    assert ran == []


def test_manage_py_chooses_before_the_settings_and_says_which(monkeypatch, capsys):
    chosen: list[str] = []

    def the_demos(environ: Any) -> str:
        chosen.append(sys.argv[1])
        return "demo_fleet: writing to the demo's data directory /x/var/demo"

    ran: list[list[str]] = []
    monkeypatch.setattr(fleet_data_dir, "choose", the_demos)
    monkeypatch.setattr(management, "execute_from_command_line", ran.append)
    monkeypatch.setattr(sys, "argv", ["manage.py", "demo_fleet", "--hosts", "200"])
    manage_py().main()
    assert chosen == ["demo_fleet"] and ran == [["manage.py", "demo_fleet", "--hosts", "200"]]
    assert "writing to the demo's data directory /x/var/demo" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["manage.py", "migrate"])  # any other command: nothing chosen
    manage_py().main()
    assert chosen == ["demo_fleet"]
