"""/api/v1/docs/: the OpenAPI schema as a page a person reads, made on the server.

Swagger UI and Redoc are scripts from a CDN (or a few MB vendored) and want
inline script, which the Content-Security-Policy forbids; a lab's browser may
be offline too. This page lists every endpoint of the same generated schema
(/api/v1/schema/): method, path, summary, parameters, request body and answers,
each shape linked to its JSON Schema below.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from drf_spectacular.generators import SchemaGenerator

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.api_schema import Schema, components
from gpuadmin.kills.states import Status

METHODS = ("get", "post", "put", "patch", "delete")


def _shape(schema: dict[str, Any] | None) -> str:
    """A schema in a few words: a component's name, "list of X", or its type."""
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array" and "items" in schema:
        return f"list of {_shape(schema['items'])}"
    kind = schema.get("type", "object")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def endpoints(schema: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            found.append({
                "method": method.upper(), "path": path, "summary": operation.get("summary", ""),
                "parameters": [(p["name"], p["in"], p.get("description", ""))
                               for p in operation.get("parameters", [])],
                "request": json.dumps(body.get("schema"), indent=1) if body else "",
                "responses": [(code, answer.get("description", ""),
                               _shape(answer.get("content", {}).get("application/json", {}).get("schema")))
                              for code, answer in operation.get("responses", {}).items()],
            })
    return found


@role_required(Role.VIEWER)
def api_docs(request: HttpRequest) -> HttpResponse:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema.get("components", {}).get("schemas", {})
    return render(request, "api_docs.html", {
        "info": schema["info"], "endpoints": endpoints(schema),
        "components": [(name, json.dumps(body, indent=1)) for name, body in sorted(components.items())],
    })


def add_components(result: Schema, generator: Any, request: Any, public: bool) -> Schema:
    """drf-spectacular postprocessing hook: the components no serializer generates (``api_schema``)."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(components(tuple(Status.values)))
    return result
