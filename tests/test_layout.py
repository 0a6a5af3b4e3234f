"""The package's layout rules (docs/architecture.md, "Layout rules"): no import circles, no
function in clients/ or servers/ over 80 lines.

Every ``import`` in ``simkit`` and in ``envs/``, ``servers/``, ``clients/`` (installed as
``simkit.envs``, ``simkit.servers``, ``simkit.clients``) counts: at module level, inside
a function, under ``TYPE_CHECKING``. An import of a package counts as an import of its
``__init__``; ``from package import name`` counts as an import of ``package.name`` when
that is a module. The sources are read with :mod:`ast`, so nothing is imported here.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    """``{package: folder}`` from ``[tool.setuptools.package-dir]``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (source file, is a package)}`` for every module installed."""
    dirs = package_dirs()
    found: dict[str, tuple[Path, bool]] = {}
    for package, folder in dirs.items():
        mapped_elsewhere = {d for d in dirs.values() if d != folder and d.is_relative_to(folder)}
        for path in sorted(folder.rglob("*.py")):
            if any(path.is_relative_to(d) for d in mapped_elsewhere):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join([package, *parts])] = (path, is_package)
    return found


def imports_of(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that the source of module ``name`` imports, anywhere in it."""
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    found.add(f"{module}.{alias.name}")
                elif module in known:
                    found.add(module)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """``{module: the modules it imports}`` over the whole installed package."""
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, is_pkg, known) for name, (path, is_pkg) in found.items()}


def circles(graph: dict[str, set[str]]) -> Iterator[tuple[list[str], set[str]]]:
    """Each strongly connected component of more than one module (Tarjan), with the
    shortest chain of imports that closes a circle in it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    for component in components:
        if len(component) > 1:
            yield shortest_circle(graph, component), component


def shortest_circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest chain of imports from the component's first module back to itself."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for dep in sorted(graph[node] & component):
                if dep == start:
                    return paths[node] + [start]
                if dep not in paths:
                    paths[dep] = paths[node] + [dep]
                    following.append(dep)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not a circle")


def test_the_walk_sees_every_installed_package() -> None:
    graph = import_graph()
    for package in ("simkit", "simkit.envs", "simkit.servers", "simkit.clients"):
        assert package in graph
    assert "simkit.registry" in graph["simkit"]
    assert any(dep.startswith("simkit.servers._") for dep in graph["simkit.servers"])


def test_circles_finds_a_circle_through_function_level_and_type_checking_imports(
    tmp_path: Path,
) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert list(circles(graph)) == [(["a", "b", "c", "a"], {"a", "b", "c"})]
    assert list(circles({"a": {"b"}, "b": set()})) == []
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import b\n"
        "def f():\n    from .c import x\n"
    )
    path = tmp_path / "a.py"
    path.write_text(source)
    assert imports_of("p.a", path, False, {"p", "p.a", "p.b", "p.c"}) == {"p.b", "p.c"}


def test_no_import_circles() -> None:
    found = [
        f"{' -> '.join(chain)}  (the circle's component: {', '.join(sorted(component))})"
        for chain, component in circles(import_graph())
    ]
    assert not found, "import circles:\n" + "\n".join(found)


MAX_FUNCTION_LINES = 80
"""Issue 29's rule for ``clients/`` and ``servers/``: a longer function is several concerns."""


def long_functions(folder: Path) -> list[str]:
    """``path:line name (n lines)`` of each function under ``folder`` over the limit."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(
                        f"{path.relative_to(folder.parent)}:{node.lineno} {node.name} ({length} lines)"
                    )
    return found


def test_no_function_in_clients_or_servers_is_longer_than_80_lines() -> None:
    dirs = package_dirs()
    assert long_functions(dirs["simkit.clients"]) + long_functions(dirs["simkit.servers"]) == []


def test_long_functions_are_found(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert [line.rsplit(" ", 3)[1:] for line in long_functions(tmp_path)] == [
        ["long", f"({MAX_FUNCTION_LINES + 1}", "lines)"]
    ]


def test_the_clients_public_names_resolve_and_each_sub_package_says_what_lives_there() -> None:
    import importlib

    import simkit.clients

    for name in simkit.clients.__all__:
        assert getattr(simkit.clients, name) is not None, name
    assert simkit.clients.PPO.__module__ == "simkit.clients.learners.ppo"
    for sub in ("remote", "learners", "launcher"):
        doc = importlib.import_module(f"simkit.clients.{sub}").__doc__
        assert len((doc or "").split()) > 10, sub


def test_the_env_step_is_at_most_five_calls_below_the_rollout_loop() -> None:
    """From ``RolloutLoop.step`` down to the author's env, a reader follows at most five
    calls: the rows, the vector's step, the core's dispatch, its per-env step, the env."""
    import traceback

    import simkit
    from simkit.clients.learners._sources import LocalSource
    from simkit.models import ModelSpec, build_model

    stacks: list[list[tuple[str, str]]] = []
    base_step = simkit.Env.step

    def recording_step(self: Any, action: Any) -> Any:
        if not stacks:
            stacks.append([(f.filename, f.name) for f in traceback.extract_stack()[:-1]])
        return base_step(self, action)

    env_id = "simkit/CartPole-v0"
    space = simkit.make(env_id)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [8]}), *_spaces(space))
    source = LocalSource(env_id, model, num_envs=2, num_steps=2, seed=0)
    source.push_weights(model)
    simkit.Env.step = recording_step  # type: ignore[method-assign]
    try:
        source.rollout()
    finally:
        simkit.Env.step = base_step  # type: ignore[method-assign]
        source.close()
    frames = stacks[0]
    loop = max(
        i for i, (path, name) in enumerate(frames) if path.endswith("_loop.py") and name == "step"
    )
    below = [name for _, name in frames[loop + 1 :]] + ["Env.step"]
    assert len(below) <= 5, below


def _spaces(env: Any) -> tuple[Any, Any]:
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
