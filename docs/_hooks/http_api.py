"""The endpoint list of docs/http-api.md, generated from the service's own OpenAPI schema.

The block between ``<!-- openapi:endpoints -->`` and ``<!-- /openapi:endpoints -->`` is rendered from
``nobackfill.serve.create_app(...).openapi()`` over an empty collection; tests/test_docs_site.py
fails when the committed page differs. Refresh it with::

    .venv/bin/python docs/_hooks/http_api.py          # --check: exit 1 if the page is stale
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[1] / "http-api.md"
BLOCK = re.compile(r"(<!-- openapi:endpoints -->\n)(.*?)(<!-- /openapi:endpoints -->)", re.S)
METHODS = ("get", "post", "put", "patch", "delete")


def openapi() -> dict[str, Any]:
    """The schema a default ``nobackfill serve`` publishes (default limits, an empty collection)."""
    from nobackfill.collection.collection import Collection
    from nobackfill.serve import KeyRing, ServeSettings, create_app

    with tempfile.TemporaryDirectory() as tmp:
        c = Collection.create(Path(tmp) / "c", space_id="docs", dim=4, model="docs", name="docs")
        keys = KeyRing({"read": ["r" * 24], "admin": ["a" * 24]})
        return create_app(ServeSettings(collection=str(c.path), keys=keys, warm=False)).openapi()


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _ref(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else None


def _type(s: dict[str, Any]) -> str:
    if name := _ref(s):
        return f"[{name}](#{name.lower()})"
    if "anyOf" in s:
        parts = [_type(x) for x in s["anyOf"] if x.get("type") != "null"]
        nullable = any(x.get("type") == "null" for x in s["anyOf"])
        return " or ".join(parts) + (" or null" if nullable else "")
    if "enum" in s:
        return " \\| ".join(f"`{v!r}`".replace("'", '"') for v in s["enum"])
    t = s.get("type", "any")
    if t == "array":
        return f"list of {_type(s.get('items', {}))}"
    if t == "string" and s.get("format") == "binary":
        return "file"
    return str(t)


def _fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    if not props:
        return []
    required = set(schema.get("required", []))
    rows = ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for name, p in props.items():
        default = "" if "default" not in p or p["default"] is None else f"`{p['default']!r}`"
        rows.append(f"| `{name}` | {_type(p)} | {'yes' if name in required else ''} | {_cell(default)} "
                    f"| {_cell(p.get('description'))} |")
    return rows


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        if name := _ref(node):
            out.add(name)
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def _key(op: dict[str, Any]) -> str:
    if not op.get("security"):
        return "none"
    return "admin" if "403" in op.get("responses", {}) else "read or admin"


def render(doc: dict[str, Any]) -> str:
    """The block: a summary table, one section per operation, then every schema they use."""
    ops = [(m, path, op) for path, item in doc["paths"].items() for m, op in item.items() if m in METHODS]
    lines = ["| endpoint | key | what |", "|---|---|---|"]
    for m, path, op in ops:
        anchor = re.sub(r"[^\w\s-]", "", f"{m} {path}").strip().lower().replace(" ", "-")
        lines.append(f"| [`{m.upper()} {path}`](#{anchor}) | {_key(op)} | {_cell(op.get('summary'))} |")
    schemas = doc.get("components", {}).get("schemas", {})
    used: set[str] = set()
    errors: dict[str, str] = {}
    for m, path, op in ops:
        lines += ["", f"### `{m.upper()} {path}`", "", f"{_cell(op.get('summary'))}. Key: {_key(op)}."]
        params = op.get("parameters", [])
        if params:
            lines += ["", "| parameter | in | type | required | default | description |", "|---|---|---|---|---|---|"]
            for p in params:
                s = p.get("schema", {})
                default = "" if s.get("default") is None else f"`{s['default']!r}`"
                lines.append(f"| `{p['name']}` | {p['in']} | {_type(s)} | {'yes' if p.get('required') else ''} "
                             f"| {_cell(default)} | {_cell(p.get('description') or s.get('description'))} |")
        for ctype, body in op.get("requestBody", {}).get("content", {}).items():
            lines += ["", f"Request body, `{ctype}`: {_type(body.get('schema', {}))}."]
        statuses = []
        for status, resp in op.get("responses", {}).items():
            if status.startswith("2"):
                note = _cell(resp.get("description")).rstrip(".")
                for ctype, body in resp.get("content", {}).items():
                    what = [_type(body["schema"])] if body.get("schema") else []
                    what += [note] if note and note != "Successful Response" else []
                    lines += ["", f"Response `{status}`, `{ctype}`: {'; '.join(what) or 'see the schema'}."]
            else:
                statuses.append(status)
                errors.setdefault(status, _cell(resp.get("description")))
        if statuses:
            lines += ["", "Errors: " + ", ".join(f"[{s}](#errors)" for s in sorted(statuses)) + "."]
        _refs(op, used)
    lines += ["", "## Errors", "",
              "Every error is one JSON object, schema [ErrorBody](#errorbody). Every answer, errors included, "
              "carries the header `X-Nobackfill-API: v1`: a client that gets an answer without it has reached "
              "something else (the Python client raises `NotAServer`).", "",
              "| status | meaning |", "|---|---|"]
    lines += [f"| {s} | {errors[s]} |" for s in sorted(errors)]
    lines += ["", "Beyond the operations above: a path no operation has answers 404, and a method a path does "
                  "not take answers 405 naming the ones it takes (`GET is not allowed here (allowed: POST)`), "
                  "each with `field` `method` or `path`."]
    todo, seen = sorted(used), set()
    while todo:  # the schemas the operations use, and the schemas those use
        name = todo.pop(0)
        if name in seen or name not in schemas:
            continue
        seen.add(name)
        nested: set[str] = set()
        _refs(schemas[name], nested)
        todo += sorted(nested - seen)
    lines += ["", "## Schemas"]
    for name in sorted(seen):
        s = schemas[name]
        lines += ["", f"### {name}"]
        if s.get("description"):
            lines += ["", _cell(s["description"])]
        rows = _fields(s)
        if rows:
            lines += [""] + rows
    return "\n".join(lines) + "\n"


def refresh(text: str, doc: dict[str, Any]) -> str:
    m = BLOCK.search(text)
    if not m:
        raise ValueError(f"{PAGE}: no <!-- openapi:endpoints --> block")
    return text[:m.start(2)] + render(doc) + text[m.end(2):]


def main(argv: list[str]) -> int:
    old = PAGE.read_text()
    new = refresh(old, openapi())
    if "--check" in argv:
        return int(new != old)
    if new != old:
        PAGE.write_text(new)
    print(f"{PAGE}: {'refreshed' if new != old else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
