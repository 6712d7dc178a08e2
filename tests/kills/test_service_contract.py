"""The services package's contract: views, the API, tasks and receivers change kill requests
only through ``gpuadmin.kills.services`` (its package, not its modules), and never write
kill models themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuadmin.kills

KILLS = Path(gpuadmin.kills.__file__).resolve().parent
CALLERS = ["views.py", "api.py", "tasks.py", "receivers.py", "admin.py"]
# Methods that write a row or move a status: the services' business alone.
WRITES = {"save", "create", "bulk_create", "update", "update_or_create", "get_or_create", "delete",
          "transition", "select_for_update", "locked"}


def _tree(name: str) -> ast.Module:
    return ast.parse((KILLS / name).read_text(encoding="utf-8"), filename=name)


def _writes(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in WRITES:
            continue
        if node.func.attr == "update" and isinstance(node.func.value, ast.Name):
            continue  # a local dict's update (context.update); a queryset's is on a chain or a manager
        found.append(f"line {node.lineno}: .{node.func.attr}()")
    return found


@pytest.mark.parametrize("name", CALLERS)
def test_a_caller_imports_the_services_package_not_its_modules(name: str) -> None:
    reaching_in = [
        f"line {node.lineno}: {node.module}"
        for node in ast.walk(_tree(name))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuadmin.kills.services.")
    ]
    assert reaching_in == []


@pytest.mark.parametrize("name", CALLERS)
def test_a_caller_writes_nothing_itself(name: str) -> None:
    assert _writes(_tree(name)) == []


def test_the_contract_catches_a_write() -> None:
    """The check above can fail: saves and queryset updates in a caller are found, a dict's update is not."""
    tree = ast.parse(
        "def view(request):\n"
        "    kill_request.save()\n"
        "    KillRequest.objects.filter(pk=1).update(status='x')\n"
        "    context.update(a=1)\n"
    )
    assert _writes(tree) == ["line 2: .save()", "line 3: .update()"]
