"""The shape of the code, read from its imports: other packages reach the memory engine and
the embedded servers through their front doors only, service modules import no web
framework, no import circle among modules or packages, short docstrings, no pointers
outside the repo."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dashboard", "jobs")
# Packages whose front door (their __init__) is all that code outside them may import.
FRONT_DOORS = ("dashboard.memory", "dashboard.embedded")
# The app factory registers each package's pages: a package's blueprint module is public
# to it alone.
BLUEPRINTS = {"dashboard.memory.views"}
APP_FACTORY = "dashboard.app"
# The edge: modules that speak HTTP, forms, the CLI or the process; everything else under
# dashboard/ is a service (or a model) and must not import a web framework or the edge.
EDGE_NAMES = {"views", "pages", "key_pages", "profile_pages", "team_pages", "api", "openapi",
              "web", "forms", "decorators", "oauth", "mcp", "mcp_http", "cli"}
EDGE_MODULES = {"dashboard", "dashboard.app", "dashboard.cli", "dashboard.errors",
                "dashboard.extensions", "dashboard.forms", "dashboard.gunicorn_hooks",
                "dashboard.metrics", "dashboard.queues", "dashboard.security",
                "dashboard.staff", "dashboard.supervisor", "dashboard.views"}
EDGE_PACKAGES = ("dashboard.admin",)
# Model modules may build on Flask-SQLAlchemy's ``db.Model`` (and Flask-Login's mixin).
MODEL_NAMES = {"models", "models_base", "leases"}
WEB_IMPORTS = ("flask", "flask_", "werkzeug.exceptions", "wtforms", "spectree")
MAX_DOCSTRING_LINES = 12


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for inner in ast.walk(node)}
    return skipped


def imports_of(name: str) -> list[str]:
    """Every module ``name`` imports (function-local ones too; not TYPE_CHECKING ones),
    spelled absolutely; ``from package import module`` names the module."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names
                      if f"{base}.{alias.name}" in MODULES]
    return found


def _own(target: str) -> str | None:
    """The module of ours ``target`` names (a name inside a module names the module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _is_edge(name: str) -> bool:
    """An edge: listed, or a domain's page/API module (``dashboard.<domain>.views`` …)."""
    parts = name.split(".")
    return (name in EDGE_MODULES or (len(parts) == 3 and parts[2] in EDGE_NAMES)
            or name.startswith(EDGE_PACKAGES) or name.startswith("jobs"))


def _door_aliases(tree: ast.AST) -> dict[str, str]:
    """Names a module gives a front door (``from dashboard import memory``, ``import
    dashboard.memory as engine``): alias -> the door."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in FRONT_DOORS:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in FRONT_DOORS and alias.asname:
                    aliases[alias.asname] = alias.name
    return aliases


def _public(door: str) -> set[str]:
    tree = ast.parse(MODULES[door].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{door} has no __all__")


def test_other_packages_reach_the_engine_and_the_servers_through_their_front_doors():
    wrong = []
    for name in MODULES:
        for target in imports_of(name):
            for door in FRONT_DOORS:
                inside = name == door or name.startswith(door + ".")
                if target.startswith(door + ".") and not inside \
                        and not (name == APP_FACTORY and target in BLUEPRINTS):
                    wrong.append(f"{name} imports {target} (use {door})")
    assert wrong == []


def test_what_goes_through_a_front_door_is_on_its_list():
    """``memory.pipeline.x`` would slip past the import check: every name taken from a
    front door (an attribute of it, or imported from it) is one its ``__all__`` names."""
    wrong = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for door in FRONT_DOORS:
            if name == door or name.startswith(door + "."):
                continue
            public = _public(door)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == door:
                    wrong += [f"{name} imports {door}.{a.name}" for a in node.names
                              if a.name not in public]
            for alias, target in _door_aliases(tree).items():
                if target != door:
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                            and node.value.id == alias and node.attr not in public:
                        wrong.append(f"{name} uses {door}.{node.attr}")
    assert wrong == []


# The engine's own tables: rows only the engine writes (others ask it, through its door).
ENGINE_TABLES = {"MemoryBuild", "MemoryChunk", "MemoryState", "DeletedPart"}


def engine_writes_outside(modules: dict[str, Path]) -> list[str]:
    """``delete(X)``/``update(X)``/``insert(X)`` of an engine table outside the engine."""
    found = []
    for name, path in modules.items():
        if name == "dashboard.memory" or name.startswith("dashboard.memory."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("delete", "update", "insert", "pg_insert") \
                    and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in ENGINE_TABLES:
                found.append(f"{name}:{node.lineno} {node.func.id}({node.args[0].id})")
    return found


def test_only_the_engine_writes_its_own_tables():
    assert engine_writes_outside(MODULES) == []


def test_every_refusal_kind_has_an_answer_at_each_edge():
    from dashboard.errors import PAGE_STATUS
    from dashboard.refusals import KINDS
    from dashboard.saved_memories.api import REFUSALS

    assert set(PAGE_STATUS) == set(KINDS) == set(REFUSALS)


def test_service_modules_import_no_web_framework():
    wrong = []
    for name in MODULES:
        if not name.startswith("dashboard") or _is_edge(name):
            continue
        model = name.split(".")[-1] in MODEL_NAMES
        for target in imports_of(name):
            web = target.startswith(WEB_IMPORTS) and not (model and target.startswith(
                ("flask_sqlalchemy", "flask_login")))
            edge = (_own(target) or "").startswith("dashboard") and _is_edge(_own(target)) \
                and not (model and _own(target) == "dashboard.extensions")
            if web or edge:
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name in MODULES:
        for target in imports_of(name):
            own = _own(target)
            if own is not None and own != name:
                graph[name].add(own)
    return graph


def package_of(module: str) -> str:
    """``dashboard.memory.pipeline`` -> ``dashboard.memory``; ``dashboard.sources`` is a
    package of its own, ``dashboard`` (its ``__init__``) too; all of ``jobs`` is one."""
    parts = module.split(".")
    return "jobs" if parts[0] == "jobs" else ".".join(parts[:2])


def _package_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """Packages and the imports between them, with one import that makes each edge."""
    graph: dict[str, set[str]] = defaultdict(set)
    example: dict[tuple[str, str], str] = {}
    for name, targets in _module_graph().items():
        for target in sorted(targets):
            edge = (package_of(name), package_of(target))
            if edge[0] != edge[1]:
                graph[edge[0]].add(edge[1])
                example.setdefault(edge, f"{name} imports {target}")
    return graph, example


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_among_our_modules():
    cycle = _cycle(_module_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_circle_among_our_packages():
    """Each domain folder (and each top-level module) is one node: a domain may build on
    another, never both ways. The content domains give the engine their sources through
    the registry (``dashboard.catalog`` installs them) instead of the engine importing
    them."""
    graph, example = _package_graph()
    cycle = _cycle(graph)
    assert cycle is None, "package circle: " + " -> ".join(cycle) + "\n" + "\n".join(
        example[edge] for edge in zip(cycle, cycle[1:], strict=False))


def test_the_checks_see_what_they_claim_to(tmp_path):
    """The checks are not vacuous: the graph has the edges we know of."""
    assert "dashboard.memory" in imports_of("dashboard.saved_memories.forgetting")
    assert "dashboard.memory.models" in imports_of("dashboard.memory.pipeline")
    assert not _is_edge("dashboard.memory.pipeline") and _is_edge("dashboard.memory.views")
    assert not _is_edge("dashboard.memory.x.views")
    assert any(t.startswith("flask") for t in imports_of("dashboard.memory.views"))
    assert _door_aliases(ast.parse("from dashboard import memory")) == \
        {"memory": "dashboard.memory"}
    assert "execute_build" in _public("dashboard.memory")
    assert package_of("dashboard.memory.pipeline") == "dashboard.memory"
    assert package_of("jobs.worker") == "jobs" and package_of("dashboard") == "dashboard"
    graph, _ = _package_graph()
    assert {"dashboard.memory", "dashboard.sources"} <= graph["dashboard.orbitpilot"]
    # A circle is found, and named, where there is one.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


SOURCE_TREES = ("dashboard", "jobs", "tests", "bench", "migrations", "scripts")


def _python_files() -> list[Path]:
    return [path for tree in SOURCE_TREES for path in sorted((ROOT / tree).rglob("*.py"))]


def test_no_docstring_is_an_essay():
    long = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc and doc.count("\n") + 1 > MAX_DOCSTRING_LINES:
                    where = getattr(node, "name", "module")
                    long.append(f"{path.relative_to(ROOT)}:{where}")
    assert long == []


@pytest.mark.parametrize("tree", ["dashboard", "jobs", "migrations", "templates", "tests", "bench",
                                  "docs", "scripts"])
def test_nothing_points_at_sections_of_a_document_outside_the_repository(tree):
    marked = [str(path.relative_to(ROOT)) for path in sorted((ROOT / tree).rglob("*"))
              if path.is_file() and path.suffix in {".py", ".html", ".md", ".js", ".css"}
              and "\u00a7" in path.read_text(encoding="utf-8")]
    assert marked == []


def test_the_engine_table_check_sees_a_write_from_outside(tmp_path):
    module = tmp_path / "prunes.py"
    module.write_text("from sqlalchemy import delete\n"
                      "def prune(session):\n"
                      "    session.execute(delete(MemoryBuild))\n")
    assert engine_writes_outside({"dashboard.retention.prunes": module}) == [
        "dashboard.retention.prunes:3 delete(MemoryBuild)"]
