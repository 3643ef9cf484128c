"""The package's layers: imports go down only, no cycles, no lazy imports of our own modules, no
private names used across modules; the core never imports the CLI or the test servers.

The rules read the source (``ast``), so an import under ``if TYPE_CHECKING:`` or inside a
function is an edge of the import graph like any other.
"""

from __future__ import annotations

import ast
import itertools
import json
import pkgutil
import subprocess
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncckpt

OUTER = ("asyncckpt.bench", "asyncckpt.servers")
PACKAGE = Path(asyncckpt.__file__).parent
REPO = PACKAGE.parent

#: lowest first: a module imports only its own top-level package or a lower layer
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    (
        "units",
        "modes",
        "secrets",
        "checksum",
        "blocking",
        "cpu",
        "priority",
        "owner",
        "deprecated",
        "moved",
    ),
    ("pool",),  # faults its pages in through blocking.run_blocking
    ("env",),
    ("results",),
    ("node",),
    ("sources",),
    ("sinks",),
    ("config",),
    ("engine",),
    ("state",),
    ("steps", "retention", "preempt"),
    ("checkpointer",),
    ("drain", "replicas"),
    ("tiers",),
    ("manager",),
    ("integrations",),
    ("servers",),
    ("bench",),
    ("__init__", "__main__"),  # asyncckpt/__init__.py (and an asyncckpt/__main__.py if any)
)
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}

#: the modules that may call importlib.import_module (a module named in a table), and why; an
#: import statement of an asyncckpt module inside a function is never allowed
DYNAMIC_IMPORTS = {
    "asyncckpt.sinks.s3": "the backend registry: S3_BACKENDS names each backend's module, loaded "
    "on first use because it imports a heavy optional client library at its top",
    "asyncckpt.sinks.azure": "the Azure backend table: AZURE_BACKENDS names each backend's module, "
    "loaded on first use because it imports an optional client library at its top",
    "asyncckpt.moved": "the old import paths: MOVED names the module each old path now is",
    "asyncckpt.engine.dtypes": "optional third-party dtype libraries (torch, ml_dtypes), by name",
    "asyncckpt": "the public classes of the engine, on first use (PEP 562 __getattr__): importing any "
    "submodule runs asyncckpt/__init__.py first, and Ctrl-C while the CLI starts must reach its handler",
}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def top(self) -> str:
        """The top-level module or package below ``asyncckpt`` ("__init__": the package itself)."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    @property
    def in_subpackage(self) -> bool:
        return (PACKAGE / self.top).is_dir()


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the asyncckpt module imported (a package: its __init__)
    names: tuple[str, ...]  # what ``from target import ...`` takes (empty: a module)
    where: str  # file:line
    in_function: bool
    type_checking: bool

    @property
    def how(self) -> str:
        return " (TYPE_CHECKING)" if self.type_checking else " (in a function)" if self.in_function else ""


def package_modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        found[name] = Module(name, path, is_package)
    return found


MODULES = package_modules()


def known(name: str) -> str:
    """The module ``name`` is, or the package it is an attribute of."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")[: None if is_package else -1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement, with (inside a function, under TYPE_CHECKING)."""
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, in_function, type_checking = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function, type_checking
            continue
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, ast.If) and is_type_checking(node.test):
            stack += [(child, in_function, True) for child in node.body]
            stack += [(child, in_function, type_checking) for child in node.orelse]
            continue
        stack += [(child, in_function, type_checking) for child in ast.iter_child_nodes(node)]


def imports_of(path: Path, importer: str, is_package: bool = False) -> list[Import]:
    """The asyncckpt modules the file at ``path`` imports (``importer``: its module name)."""
    rel = path.relative_to(REPO)
    found = []
    for node, in_function, type_checking in import_nodes(ast.parse(path.read_text(), str(path))):
        targets: list[tuple[str, tuple[str, ...]]] = []
        if isinstance(node, ast.Import):
            targets = [(alias.name, ()) for alias in node.names]
        else:
            source = absolute(node, importer, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.append((sub, ()) if sub in MODULES else (source, (alias.name,)))
        for target, names in targets:
            if target.split(".")[0] == "asyncckpt":
                where = f"{rel}:{node.lineno}"
                found.append(Import(importer, known(target), names, where, in_function, type_checking))
    return found


IMPORTS = [
    i for m in MODULES.values() for i in imports_of(m.path, m.name, m.is_package) if i.target != i.importer
]


def report(title: str, lines: Iterable[str]) -> str:
    shown = sorted(set(lines))
    return f"{title} ({len(shown)}):\n  " + "\n  ".join(shown)


def edges(imports: list[Import]) -> dict[tuple[str, str], str]:
    """(importer, imported) -> where (its first import)."""
    found: dict[tuple[str, str], str] = {}
    for i in imports:
        found.setdefault((i.importer, i.target), i.where)
    return found


def upward(i: Import) -> bool:
    a, b = MODULES[i.importer], MODULES[i.target]
    if a.top == b.top and a.in_subpackage:
        return False
    return LAYER.get(b.top, -1) >= LAYER.get(a.top, -1)


def test_imports_go_down_the_layers() -> None:
    problems = [
        f"{m.path.relative_to(REPO)}: {m.top!r} is in no layer"
        for m in MODULES.values()
        if m.top not in LAYER
    ]
    for i in filter(upward, IMPORTS):
        a, b = MODULES[i.importer], MODULES[i.target]
        problems.append(
            f"{i.where}: {a.name} (layer {LAYER[a.top]}) imports {b.name} (layer {LAYER[b.top]}){i.how}"
        )
    assert not problems, report("imports that do not go down the layers", problems)


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None and child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child is not None:
                if child in stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    at = stack.index(node)
                    members, stack[at:] = stack[at:], []
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def one_cycle(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, within the component."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & inside):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle")  # pragma: no cover - it is in a component


def test_the_import_graph_has_no_cycles() -> None:
    where = edges(IMPORTS)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in where:
        graph[a].add(b)
        graph[b] |= set()
    cycles = []
    for members in components(graph):
        cycle = one_cycle(graph, members)
        steps = [f"{a} ({where[a, b]})" for a, b in itertools.pairwise(cycle)]
        cycles.append(" -> ".join([*steps, cycle[0]]))
    assert not cycles, report("import cycles, one per strongly connected component", cycles)


def calls_by_name(tree: ast.AST) -> Iterator[ast.Call]:
    """``importlib.import_module(...)`` and ``__import__(...)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name in ("import_module", "__import__"):
                yield node


def test_no_function_level_imports_of_the_package() -> None:
    problems = [
        f"{i.where}: {i.importer} imports {i.target} inside a function" for i in IMPORTS if i.in_function
    ]
    for m in MODULES.values():
        if m.name not in DYNAMIC_IMPORTS:
            problems += [
                f"{m.path.relative_to(REPO)}:{call.lineno}: {m.name} imports by name (not in DYNAMIC_IMPORTS)"
                for call in calls_by_name(ast.parse(m.path.read_text()))
            ]
    assert not problems, report("function-level imports of asyncckpt modules", problems)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []


def class_privates(tree: ast.AST) -> set[str]:
    """The private attributes and methods a file's classes define: ``def _y`` and ``_y = ...`` in
    a class body, ``self._y = ...`` / ``cls._y = ...`` in its methods."""
    found: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(node.name):
                found.add(node.name)
            found |= {t.id for t in assigned(node) if isinstance(t, ast.Name) and private(t.id)}
        for node in ast.walk(cls):
            found |= {
                t.attr
                for t in assigned(node)
                if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id in ("self", "cls")
                if private(t.attr)
            }
    return found


PRIVATES = {m.name: class_privates(ast.parse(m.path.read_text())) for m in MODULES.values()}


@dataclass(frozen=True)
class PrivateUse:
    module: str
    where: str
    name: str
    owners: tuple[str, ...]  # the asyncckpt modules that define it
    text: str


def receivers(node: ast.expr) -> Iterator[ast.expr]:
    """``a.b(c)[d].e`` -> its receivers, down to ``a``."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
        yield node


def foreign_names(tree: ast.AST) -> set[str]:
    """The names a file binds by importing what is not asyncckpt (``asyncio``, ``np``, ...)."""
    found = set()
    for node, _, _ in import_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {
                a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] != "asyncckpt"
            }
        elif node.level or (node.module or "").split(".")[0] != "asyncckpt":
            found |= {a.asname or a.name for a in node.names}
    return found


def imported_privates(imports: list[Import], importer: str) -> Iterator[PrivateUse]:
    """``from x import _y`` of another module; a private module imported from outside its package."""
    for i in imports:
        if i.target == importer:
            continue
        for name in filter(private, i.names):
            yield PrivateUse(importer, i.where, name, (i.target,), f"from {i.target} import {name}")
        hidden = [part for part in i.target.split(".") if private(part)]
        if hidden and not importer.startswith(i.target.rsplit(".", 1)[0] + "."):
            yield PrivateUse(
                importer, i.where, hidden[0], (i.target,), f"imports the private module {i.target}"
            )


def attribute_privates(tree: ast.AST, importer: str, rel: Path) -> Iterator[PrivateUse]:
    """``obj._y`` where a class of another asyncckpt module defines ``_y`` (per chain, the first)."""
    mine, foreign = class_privates(tree), foreign_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not private(node.attr) or node.attr in mine:
            continue
        chain = list(receivers(node))
        root = chain[-1]
        if isinstance(root, ast.Name) and (root.id in ("self", "cls") or root.id in foreign):
            continue
        if any(isinstance(r, ast.Attribute) and private(r.attr) for r in chain):
            continue
        owners = tuple(sorted(m for m, names in PRIVATES.items() if node.attr in names and m != importer))
        if owners:
            text = f"{ast.unparse(node)} (defined in {', '.join(owners)})"
            yield PrivateUse(importer, f"{rel}:{node.lineno}", node.attr, owners, text)


def private_uses(path: Path, importer: str, is_package: bool = False) -> list[PrivateUse]:
    """The private names of other asyncckpt modules that the file at ``path`` uses."""
    tree = ast.parse(path.read_text(), str(path))
    imports = imports_of(path, importer, is_package)
    return [
        *imported_privates(imports, importer),
        *attribute_privates(tree, importer, path.relative_to(REPO)),
    ]


def test_the_package_uses_no_private_names_of_other_modules() -> None:
    uses = [u for m in MODULES.values() for u in private_uses(m.path, m.name, m.is_package)]
    problems = [f"{u.where}: {u.text}" for u in uses]
    assert not problems, report("private names used across asyncckpt modules", problems)


def outside_uses() -> list[PrivateUse]:
    """Private names of asyncckpt that tests/ and benchmarks/ use."""
    paths = sorted(p for folder in ("tests", "benchmarks") for p in (REPO / folder).rglob("*.py"))
    return [u for p in paths for u in private_uses(p, ".".join(p.relative_to(REPO).with_suffix("").parts))]


def test_tests_and_benchmarks_use_no_private_names_of_the_package() -> None:
    uses = outside_uses()
    assert not uses, report(
        "private names of asyncckpt in tests/ and benchmarks/", [f"{u.where}: {u.text}" for u in uses]
    )


def core_modules() -> list[str]:
    """Every module of the package outside the CLI and the servers (the sinks' included)."""
    found = pkgutil.walk_packages(asyncckpt.__path__, "asyncckpt.")
    return sorted(m.name for m in found if not m.name.startswith(OUTER) and not m.name.endswith("__main__"))


#: what only sinks/ may ask: the backend behind a URI by its name or scheme, and the wrappers'
#: types. Everyone else asks a handle's (or ``sinks.capabilities(uri)``'s) capabilities.
STORAGE_INTERNALS = frozenset(
    {"scheme_of", "resolve_backend", "backend_class", "BACKENDS", "SCHEMES", "ProcessSink", "WatchedSink"}
)


def test_storage_is_asked_by_capability_outside_sinks() -> None:
    problems = [
        f"{i.where}: {i.importer} imports {name} from {i.target}"
        for i in IMPORTS
        if not i.importer.startswith("asyncckpt.sinks")
        for name in i.names
        if name in STORAGE_INTERNALS
    ]
    assert not problems, report("storage asked by name or scheme outside sinks/", problems)


#: store-generic packages and the store-specific packages they must not know
STORE_GENERIC = {
    "asyncckpt.sinks.objstore": ("asyncckpt.sinks.s3", "asyncckpt.sinks.azure", "asyncckpt.sinks.gcs")
}


def test_the_object_store_protocols_know_no_store() -> None:
    """An Azure or GCS sink reuses ``sinks/objstore/`` only if nothing there leans on S3."""
    assert any(m.startswith("asyncckpt.sinks.objstore.") for m in MODULES)
    problems = [
        f"{i.where}: {i.importer} imports {i.target}"
        for generic, specific in STORE_GENERIC.items()
        for i in IMPORTS
        if i.importer.startswith(generic) and i.target.startswith(specific)
    ]
    assert not problems, report("store-generic modules importing a store", problems)


def test_core_modules_import_neither_the_cli_nor_the_servers() -> None:
    modules = core_modules()
    assert {"asyncckpt.checkpointer", "asyncckpt.engine.pipeline", "asyncckpt.sinks.file"} <= set(modules)
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({OUTER!r}))))\n"
    )
    cmd = [sys.executable, "-c", probe]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_the_servers_are_reachable_from_the_cli() -> None:
    from asyncckpt.bench.cli import build_parser
    from asyncckpt.servers.embedded import start_for_bench

    assert callable(start_for_bench)
    assert "--embedded-s3" in build_parser().format_help()


def test_import_asyncckpt_loads_no_engine_and_every_public_name_resolves() -> None:
    """``import asyncckpt`` (run first by every submodule's import) stays light; the names of
    ``__all__`` load on first use, each the class its module defines."""
    code = (
        "import sys, asyncckpt\n"
        "heavy = sorted(m for m in ('numpy', 'asyncckpt.checkpointer', 'asyncckpt.engine', 'asyncckpt.sinks')"
        " "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "for name in asyncckpt.__all__:\n"
        "    value = getattr(asyncckpt, name)\n"
        "    assert name == '__version__' or getattr(value, '__name__', name) == name, (name, value)\n"
        "from asyncckpt import AsyncCheckpointer\n"
        "from asyncckpt.checkpointer import AsyncCheckpointer as Same\n"
        "assert AsyncCheckpointer is Same and 'AsyncCheckpointer' in dir(asyncckpt)\n"
        "try:\n"
        "    asyncckpt.NoSuchThing\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchThing' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
