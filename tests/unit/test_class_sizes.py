"""Issue 47's rule for the production code: no class over 220 lines in service/, workers/,
shm/, wire/ and factory/. Generated protobuf modules (*_pb2.py) are not read. `Config`
(service/config/settings.py) is a declarative field list, each setting declared once with its help
(the one description that makes the flags, the environment names, the config file's schema
and the reference page): its fields are not counted, its methods are."""

from __future__ import annotations

import ast

from devkit.launcher import ROOT

LIMIT = 220
FOLDERS = ("service", "workers", "shm", "wire", "factory")
FIELD_LISTS = {("service/config/settings.py", "Config")}  # declarative: only the methods count


def class_lines(path: str, node: ast.ClassDef) -> int:
    if (path, node.name) not in FIELD_LISTS:
        return (node.end_lineno or node.lineno) - node.lineno + 1
    return sum(
        (item.end_lineno or item.lineno) - item.lineno + 1
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def sizes() -> dict[str, int]:
    found = {}
    for folder in FOLDERS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            if file.name.endswith("_pb2.py"):
                continue
            path = file.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(file.read_text(), path)):
                if isinstance(node, ast.ClassDef):
                    found[f"{path}:{node.name}"] = class_lines(path, node)
    return found


def test_no_class_is_over_220_lines() -> None:
    found = sizes()
    assert len(found) > 100  # the walk read the tree
    assert "service/protocols/rpc/http2/streams.py:StreamTable" in found
    over = {name: n for name, n in found.items() if n > LIMIT}
    assert not over, f"classes over {LIMIT} lines: {over}"


def test_the_field_list_exception_counts_methods() -> None:
    """Config's methods are counted: the exception covers its fields only."""
    found = sizes()
    assert 0 < found["service/config/settings.py:Config"] < LIMIT
