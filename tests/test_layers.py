"""The import rules of docs/architecture.md ("Layers"): every module of pulsartxn imports only
its own layer and those below, and no two modules import each other, even through others.

Imports are read with ``ast`` from the sources (.py, and the import lines of .pyx), at module
level and inside functions; those under ``if TYPE_CHECKING:`` are left out (never run). An
import names a module: the packages it sits in are not counted (``pulsartxn/__init__.py``
re-exports the API and runs first whatever is imported).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pulsartxn"

# Bottom to top. A prefix names a module and what is under it; "pulsartxn" alone is the
# package's __init__. The most specific prefix decides (server.protocol is not server).
LAYERS = (
    ("errors", ("pulsartxn.errors",)),
    ("native", ("pulsartxn._native",)),
    ("storage", ("pulsartxn.storage",)),
    ("txn", ("pulsartxn.txn", "pulsartxn.config")),
    ("messaging", ("pulsartxn.messaging",)),
    ("cluster", ("pulsartxn.cluster",)),
    ("protocol", ("pulsartxn.server.protocol",)),
    ("remote", ("pulsartxn.remote",)),
    (
        "api",
        ("pulsartxn.client", "pulsartxn.scan", "pulsartxn.admin", "pulsartxn.broker", "pulsartxn"),
    ),
    ("server", ("pulsartxn.server",)),
    (
        "tools",
        (
            "pulsartxn.spark",
            "pulsartxn.cli",
            "pulsartxn.admin_cli",
            "pulsartxn.client_cli",
            "pulsartxn.__main__",
            "pulsartxn.demo",
            "pulsartxn.perf",
            "pulsartxn.torture",
            "pulsartxn.torture_cluster",
        ),
    ),
)

_IMPORT_LINE = re.compile(r"^[ \t]*(from[ \t]+\S+[ \t]+c?import[ \t]|c?import[ \t])")


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, name) of `module`'s layer, or None when no layer claims it."""
    best = None
    for rank, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "pulsartxn"
            if module == prefix or (not exact and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank, name)
    return None if best is None else best[1:]


def pyx_source(text: str) -> str:
    """The import statements of a Cython source as Python (cimport read as import), each
    with its indentation dropped: enough for ast to read what it imports."""
    lines, out, pending = text.splitlines(), [], None
    for line in lines:
        if pending is not None:
            pending += " " + line.strip()
            if ")" in line:
                out.append(pending)
                pending = None
            continue
        if _IMPORT_LINE.match(line):
            stmt = line.strip().split("#")[0].replace(" cimport ", " import ")
            stmt = re.sub(r"^cimport ", "import ", stmt)
            if "(" in stmt and ")" not in stmt:
                pending = stmt
            else:
                out.append(stmt)
    return "\n".join(out)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(nodes):
    """Every statement under `nodes`, but those of ``if TYPE_CHECKING:`` bodies."""
    for node in nodes:
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, None) or [])


def imports_of(module: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The pulsartxn modules `module` imports (the most specific known name of each)."""
    out = set()
    for node in _statements(ast.parse(source).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            targets = [
                f"{parent}.{alias.name}" if f"{parent}.{alias.name}" in known else parent
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "pulsartxn" or target.startswith("pulsartxn."):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]  # a name inside a module
                out.add(target)
    out.discard(module)
    return out


def sources(root: Path = ROOT) -> dict[str, tuple[bool, str]]:
    """Module name -> (is a package's __init__, its imports as Python source)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = ["pulsartxn", *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        text = path.read_text()
        out[name] = (is_package, pyx_source(text) if path.suffix == ".pyx" else text)
    return out


def graph_of(srcs: dict[str, tuple[bool, str]]) -> dict[str, set[str]]:
    known = set(srcs)
    return {m: imports_of(m, pkg, src, known) for m, (pkg, src) in srcs.items()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a layer above the importer's, and each module no layer claims."""
    problems = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        if mine is None:
            problems.append(f"{module}: in no layer (add it to LAYERS and docs/architecture.md)")
            continue
        for target in sorted(targets):
            theirs = layer_of(target)
            if theirs is not None and theirs[0] > mine[0]:
                problems.append(f"{module} ({mine[1]}) imports {target} ({theirs[1]})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return graph_of(sources())


def test_no_module_imports_a_layer_above_its_own(graph):
    assert upward(graph) == []


def test_no_import_cycle_between_modules(graph):
    assert cycles(graph) == []


def test_the_native_core_imports_only_itself_and_the_errors(graph):
    for module, targets in graph.items():
        if module.startswith("pulsartxn._native"):
            assert {layer_of(t)[1] for t in targets} <= {"native", "errors"}, (module, targets)


def test_the_rules_are_read_from_real_modules(graph):
    """The checks see what they are meant to: imports at module level, in .pyx files, inside
    functions, and not those of TYPE_CHECKING blocks."""
    assert "pulsartxn._native.outcome" in graph["pulsartxn._native.producer"]  # a cimport
    assert "pulsartxn.remote" in graph["pulsartxn.client"]
    assert "pulsartxn.messaging.consumer" not in graph["pulsartxn.messaging.subscription"]
    assert len(graph) > 80


FAKE = {
    "pulsartxn.errors": (False, ""),
    "pulsartxn.storage": (True, "from .ops import WriteOp\n"),
    "pulsartxn.storage.ops": (False, "from ..errors import X\n"),
    "pulsartxn.txn": (True, ""),
    "pulsartxn.txn.log": (False, "from ..storage import WriteOp\n"),
    "pulsartxn.messaging": (True, ""),
    "pulsartxn.messaging.a": (False, "from typing import TYPE_CHECKING\nfrom . import b\n"),
    "pulsartxn.messaging.b": (False, "if TYPE_CHECKING:\n    from .a import A\n"),
}


def test_an_upward_import_fails_the_check_even_inside_a_function():
    srcs = dict(FAKE)
    assert upward(graph_of(srcs)) == [] and cycles(graph_of(srcs)) == []
    srcs["pulsartxn.storage.ops"] = (False, "def f():\n    from ..txn.log import X\n")
    assert upward(graph_of(srcs)) == [
        "pulsartxn.storage.ops (storage) imports pulsartxn.txn.log (txn)"
    ]
    assert cycles(graph_of(srcs)) == [
        ["pulsartxn.storage", "pulsartxn.storage.ops", "pulsartxn.txn.log"]
    ]


def test_a_cycle_within_a_layer_fails_the_check_and_type_checking_does_not():
    srcs = dict(FAKE)
    srcs["pulsartxn.messaging.b"] = (False, "def f():\n    from .a import A\n")
    assert cycles(graph_of(srcs)) == [["pulsartxn.messaging.a", "pulsartxn.messaging.b"]]
    assert upward(graph_of(srcs)) == []


def test_a_module_in_no_layer_fails_the_check():
    srcs = {**FAKE, "pulsartxn.newthing": (False, "")}
    assert upward(graph_of(srcs)) == [
        "pulsartxn.newthing: in no layer (add it to LAYERS and docs/architecture.md)"
    ]
