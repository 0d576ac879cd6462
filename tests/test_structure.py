"""Package structure: no import cycles (module-level and function-level imports alike), `aogpt.cli`
used only by itself, no source file over 500 lines, folders that import each other one way only (the
folder-level graph has no circle), each concept in one place (no package that only re-exports
another) and README's layout tree naming what is there.

`import_graph` parses every module under src/aogpt with `ast` (nothing is imported) and returns its
``aogpt.*`` import edges; `find_cycle` finds a cycle in such a graph.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "aogpt"
MAX_LINES = 500


def module_files(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of `package` (a package is its ``__init__``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name that ``from <level dots><target> import ...`` in `module` refers to."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of `package` it imports}``, counting every import statement wherever it is
    (module level, inside functions, under ``if TYPE_CHECKING``).

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; an edge to a
    package means its ``__init__``. An import of a module outside `package` adds no edge, and importing
    ``a.b.c`` is not counted as importing ``a`` and ``a.b`` (Python runs their ``__init__`` first, but
    a package importing its own submodules would otherwise always be a cycle).
    """
    files = module_files(src, package)
    graph: dict[str, set[str]] = {name: set() for name in files}

    def known(name: str) -> str | None:
        while name and name not in files:  # ``import aogpt.x.y`` of a name that is not a module file
            name = name.rpartition(".")[0]
        return name or None

    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for target in targets:
                if in_package(target, package):
                    name = known(target)
                    if name is not None and name != module:
                        graph[module].add(name)
    return graph


def in_package(name: str, package: str) -> bool:
    """`name` is `package` or one of its submodules."""
    return name == package or name.startswith(package + ".")


def find_cycle(graph: dict[str, set[str]], within: str | None = None) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None; `within` restricts the graph to that package."""

    def inside(name: str) -> bool:
        return within is None or in_package(name, within)

    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if not inside(nxt):
                continue
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if inside(node) and node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_graph_helper_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from . import helper\nfrom .. import a\n")
    (pkg / "sub" / "b.py").write_text("import os\nfrom pkg.sub.helper import x\n")
    (pkg / "sub" / "helper.py").write_text("from ..sub import b\nfrom pkg import nothing_here\nimport pkg.a.attr\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": {"pkg.sub.helper", "pkg.a"},
        "pkg.sub.b": {"pkg.sub.helper"},
        "pkg.sub.helper": {"pkg.sub.b", "pkg", "pkg.a"},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.helper", "pkg.a"]
    assert find_cycle(graph, within="pkg.sub") == ["pkg.sub.helper", "pkg.sub.b", "pkg.sub.helper"]
    assert find_cycle(graph, within="pkg.a") is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycles_in_data() -> None:
    graph = import_graph()
    assert "aogpt.data.corpora" in graph  # the helper found the subpackage
    cycle = find_cycle(graph, within="aogpt.data")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_data_depends_on_no_other_layer_above_it() -> None:
    """aogpt.data uses only itself and the leaf helpers (errors, io, validation), never models, training or the CLI."""
    graph = import_graph()
    allowed = {"aogpt.errors", "aogpt.io", "aogpt.validation"}
    wrong = {
        (module, target)
        for module, targets in graph.items()
        if in_package(module, "aogpt.data")
        for target in targets
        if not in_package(target, "aogpt.data") and target not in allowed
    }
    assert not wrong


def test_data_package_import_is_light() -> None:
    """Spawned tokenizer workers import aogpt.data.shards: the package's re-exports must not pull in torch."""
    code = "import sys, aogpt.data.shards, aogpt.data.corpora; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_only_the_cli_imports_the_cli() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not in_package(module, "aogpt.cli") and module != "aogpt.__main__"  # python -m aogpt runs the CLI
        for target in targets
        if in_package(target, "aogpt.cli")
    )
    assert not wrong, "modules outside aogpt.cli import it: " + ", ".join(wrong)


def test_source_files_are_at_most_500_lines() -> None:
    long = {
        rel: n
        for path in module_files().values()
        if (rel := path.relative_to(SRC).as_posix())
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


VARIANT_NAMES = {"gpt", "sigma", "aogpt", "encoder-mdm"}
ASKS_THE_FAMILY = ("aogpt.train", "aogpt.evaluation", "aogpt.generation")


def variant_comparisons(path: Path) -> list[str]:
    """Comparisons that decide behaviour by a variant's name (``cfg.variant == "gpt"``,
    ``variant in ("sigma", "aogpt")``) instead of asking the model's family."""

    def names_variant(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "variant":
            return True
        if isinstance(node, ast.Constant) and node.value in VARIANT_NAMES:
            return True
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_variant(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(names_variant(x) for x in (node.left, *node.comparators)):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_training_evaluation_and_generation_never_compare_variant_names() -> None:
    assert variant_comparisons_in(ASKS_THE_FAMILY) == []
    probe = SRC.parent / "tests" / "fixtures"  # the checker itself finds such a comparison
    assert variant_comparisons_in(("aogpt.config",)) != [] or probe.is_dir()


def variant_comparisons_in(prefixes: tuple[str, ...]) -> list[str]:
    return [hit for name, path in module_files().items() if any(in_package(name, p) for p in prefixes)
            for hit in variant_comparisons(path)]


def test_variant_comparison_checker_sees_comparisons(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('def f(cfg, v):\n    a = cfg.variant == "x"\n    b = v in ("gpt", "sigma")\n    return cfg.n == 2\n')
    assert variant_comparisons(src) == ["m.py:2", "m.py:3"]


def test_the_test_command_prints_its_summary_line(tmp_path: Path) -> None:
    """scripts/test.sh runs pytest with the project's options and its parallel processes; its output
    must end with the summary line (``N passed in S s``), which -qq or --no-summary in addopts would hide."""
    root = SRC.parent
    script = (root / "scripts" / "test.sh").read_text()
    assert 'pytest -p no:cacheprovider "${PARALLEL[@]}" "$@"' in script
    parallel = re.search(r"^PARALLEL=\((.*)\)$", script, re.M).group(1).split()
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *parallel, "-c",
                             str(root / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert re.search(r"^1 passed in [\d.]+s", result.stdout.strip().splitlines()[-1]), result.stdout


# ------------------------------------------------------------------------------ one concept, one place
GONE = ("aogpt.evaluate", "aogpt.ensemble", "aogpt.genppl", "aogpt.generate")  # re-export packages, removed
# The family's hooks for scoring a model: whoever calls them evaluates, so they are called only in
# evaluation (and by the families themselves). Training's validation also scores a run's own fixed order.
HOOK_CALLERS = {
    "mc_bound": ("aogpt.evaluation",),
    "conditional_logits": ("aogpt.evaluation",),
    "order_nll": ("aogpt.evaluation", "aogpt.train.validation"),
}


def only_re_exports(path: Path) -> bool:
    """`path` (a package's ``__init__.py`` with no other module beside it) holds nothing but a
    docstring, imports, ``__all__`` and ``sys.modules`` aliasing: a second import path for code that
    lives elsewhere."""
    if path.name != "__init__.py" or sorted(path.parent.rglob("*.py")) != [path]:
        return False

    def passes_on(node: ast.stmt) -> bool:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return True  # the docstring
        if isinstance(node, ast.Assign):
            text = ast.unparse(node.targets[0])
            return text == "__all__" or text.startswith("sys.modules")
        return False

    return all(passes_on(node) for node in ast.parse(path.read_text(encoding="utf-8")).body)


def test_re_export_checker_tells_a_re_export_from_a_package(tmp_path: Path) -> None:
    texts = {
        "alias": '"""Moved."""\nimport importlib\nimport sys\n\n'
                 'sys.modules[__name__] = importlib.import_module("x.y")\n',
        "star": '"""Moved."""\nfrom x.y import *  # noqa\n__all__ = ["a"]\n',
        "real": '"""A package."""\nfrom x.y import a\n\ndef b():\n    return a\n',
    }
    for name, text in texts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(text)
    (tmp_path / "with_module").mkdir()
    (tmp_path / "with_module" / "__init__.py").write_text(texts["star"])
    (tmp_path / "with_module" / "impl.py").write_text("a = 1\n")
    found = {name: only_re_exports(tmp_path / name / "__init__.py") for name in [*texts, "with_module"]}
    assert found == {"alias": True, "star": True, "real": False, "with_module": False}


def test_no_package_only_re_exports_another() -> None:
    """Each concept has one import path: no package whose only module hands on names from elsewhere."""
    wrong = sorted(name for name, path in module_files().items() if only_re_exports(path))
    assert not wrong, "packages that only re-export: " + ", ".join(wrong)


def test_removed_import_paths_are_gone() -> None:
    import importlib.util

    assert [old for old in GONE if importlib.util.find_spec(old) is not None] == []
    assert not any(target in GONE for targets in import_graph().values() for target in targets)


# ------------------------------------------------------------------------------ folders depend one way
def folder_of(module: str, package: str = PACKAGE) -> str:
    """The node of the folder graph a module belongs to: its top-level subpackage (``aogpt.data`` for
    ``aogpt.data.shards``), or itself for a module directly under the package (``aogpt.config``)."""
    return ".".join(module.split(".")[:2]) if in_package(module, package) and module != package else module


def folder_graph(graph: dict[str, set[str]], package: str = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """``{folder: {folder it imports: ["module -> module", ...]}}``: the module edges behind each
    folder-level edge (imports within a folder are not edges)."""
    out: dict[str, dict[str, list[str]]] = {}
    for module, targets in graph.items():
        for target in sorted(targets):
            a, b = folder_of(module, package), folder_of(target, package)
            if a != b:
                out.setdefault(a, {}).setdefault(b, []).append(f"{module} -> {target}")
    return out


def folder_cycle_message(graph: dict[str, set[str]], package: str = PACKAGE) -> str | None:
    """None, or which folders import each other in a circle and the module imports behind each step."""
    folders = folder_graph(graph, package)
    cycle = find_cycle({a: set(bs) for a, bs in folders.items()})
    if cycle is None:
        return None
    steps = [f"  {a} -> {b}: " + "; ".join(folders[a][b]) for a, b in zip(cycle, cycle[1:], strict=False)]
    return "folders import each other in a circle " + " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_folder_graph_helper_names_the_imports_of_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "util.py").write_text("")
    (pkg / "low" / "core.py").write_text("from pkg import util\n")
    (pkg / "high" / "api.py").write_text("from pkg.low import core\n")
    graph = import_graph(tmp_path, "pkg")
    assert folder_of("pkg.low.core", "pkg") == "pkg.low" and folder_of("pkg.util", "pkg") == "pkg.util"
    assert folder_graph(graph, "pkg") == {"pkg.low": {"pkg.util": ["pkg.low.core -> pkg.util"]},
                                   "pkg.high": {"pkg.low": ["pkg.high.api -> pkg.low.core"]}}
    assert folder_cycle_message(graph, "pkg") is None  # every module-level import is acyclic, and so are the folders
    (pkg / "low" / "helper.py").write_text("def f():\n    from pkg.high.api import x\n")
    graph = import_graph(tmp_path, "pkg")
    assert find_cycle(graph) is None  # still no circle between files ...
    message = folder_cycle_message(graph, "pkg")  # ... but the folders lean on each other
    assert message is not None and "pkg.high -> pkg.low" in message and "pkg.low.helper -> pkg.high.api" in message


def test_folders_import_each_other_in_one_direction_only() -> None:
    """Every folder (top-level subpackage, or a module directly under src/aogpt) can be read and changed
    below the ones that use it: the folder-level import graph has no circle, of two folders or more."""
    graph = import_graph()
    folders = folder_graph(graph)
    assert "aogpt.families" in folders["aogpt.generation"] and "aogpt.config" in folders  # the graph is seen
    message = folder_cycle_message(graph)
    assert message is None, message


def hook_calls(path: Path, hooks: Iterable[str]) -> list[tuple[str, int]]:
    """(hook, line) of every call ``<something>.<hook>(...)`` in `path`."""
    names = set(hooks)
    return [(node.func.attr, node.lineno) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names]


def test_only_evaluation_scores_through_the_family() -> None:
    calls = {name: hook_calls(path, HOOK_CALLERS) for name, path in module_files().items()}
    assert {hook for hook, _ in calls["aogpt.evaluation.evaluate"]} >= {"mc_bound", "order_nll", "conditional_logits"}
    wrong = sorted(f"{name}:{line} calls {hook}" for name, found in calls.items() for hook, line in found
                   if not in_package(name, "aogpt.families")
                   and not any(in_package(name, allowed) for allowed in HOOK_CALLERS[hook]))
    assert not wrong, wrong


def readme_layout() -> set[str]:
    """The top-level modules (``name.py``) and packages (``name/``) README's layout tree names."""
    text = (SRC.parent / "README.md").read_text(encoding="utf-8")
    tree = text.split("Layout (`src/aogpt/`", 1)[1].split("```", 2)[1]
    return {m.group(1) for m in re.finditer(r"(?:^|\s)(\w+(?:\.py|/))(?=\s|$)", tree)}


def test_readme_layout_tree_names_every_top_level_module_and_nothing_else() -> None:
    present = {p.name + ("/" if p.is_dir() else "") for p in (SRC / PACKAGE).iterdir()
               if (p.suffix == ".py" and not p.name.startswith("__")) or (p / "__init__.py").is_file()}
    listed = readme_layout()
    assert listed == present, f"README lists but src lacks {sorted(listed - present)}; src has but README lacks " \
                              f"{sorted(present - listed)}"


# ------------------------------------------------------------------------------ the benchmark rooms
BENCH = "aogpt.bench"
MAX_ROOM_MODULES = 15
# A room may use another room's code only where listed here: the GPU check times generation's own
# benchmark (`aogpt.bench.generation.generate.bench_generate`, and transformers' GPT-2 beside it).
ROOM_USES = {("aogpt.bench.gpu", "aogpt.bench.generation")}


def rooms(src: Path = SRC, bench: str = BENCH) -> dict[str, list[str]]:
    """``{room: its modules}`` for every sub-package of `bench`, and ``{bench: its shared modules}``
    (the modules directly in it; ``__init__`` not counted)."""
    folder = src.joinpath(*bench.split("."))
    out = {bench: sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")}
    for init in sorted(folder.glob("*/__init__.py")):
        out[f"{bench}.{init.parent.name}"] = sorted(p.relative_to(init.parent).with_suffix("").as_posix()
                                                    for p in init.parent.rglob("*.py") if p.name != "__init__.py")
    return out


def room_of(module: str, bench: str = BENCH) -> str | None:
    """The room of a module of `bench` (``aogpt.bench.gpu`` for ``aogpt.bench.gpu.run``), `bench` itself
    for a shared module (``aogpt.bench.common``), None outside `bench`."""
    if not in_package(module, bench):
        return None
    parts = module.split(".")
    depth = len(bench.split("."))
    if len(parts) == depth + 1 and (SRC.joinpath(*parts) / "__init__.py").is_file():
        return module  # a room's package
    return ".".join(parts[: depth + 1]) if len(parts) > depth + 1 else bench


def wrong_room_imports(graph: dict[str, set[str]], bench: str = BENCH, allowed: set[tuple[str, str]] = ROOM_USES,
                       room: Callable[[str], str | None] | None = None) -> list[str]:
    """Imports between rooms of `bench` not in `allowed`, and shared modules importing a room (the shared
    ones sit below every room)."""
    room = room or (lambda m: room_of(m, bench))
    wrong = []
    for module, targets in graph.items():
        a = room(module)
        for target in sorted(targets):
            b = room(target)
            if a is None or b is None or a == b or b == bench:
                continue
            if a == bench or (a, b) not in allowed:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_room_checker_sees_rooms_importing_each_other() -> None:
    graph = {"b.x.m": {"b.common", "b.y.n"}, "b.y.n": {"b.common"}, "b.common": {"b.x.m"}, "other": {"b.x.m"},
             "b.z.k": {"b.x.m"}}

    def room(m: str) -> str | None:
        return None if not m.startswith("b.") else m.rsplit(".", 1)[0] if m.count(".") == 2 else "b"

    assert wrong_room_imports(graph, "b", set(), room) == ["b.common -> b.x.m", "b.x.m -> b.y.n", "b.z.k -> b.x.m"]
    assert wrong_room_imports(graph, "b", {("b.x", "b.y"), ("b.z", "b.x")}, room) == ["b.common -> b.x.m"]


def test_bench_rooms_hold_at_most_15_modules() -> None:
    found = rooms()
    assert {"aogpt.bench.generation", "aogpt.bench.training", "aogpt.bench.serve", "aogpt.bench.gpu"} <= set(found)
    assert "environment" in found[BENCH] and "run" in found["aogpt.bench.gpu"]  # the counter sees the modules
    big = {room: len(modules) for room, modules in found.items() if len(modules) > MAX_ROOM_MODULES}
    assert not big, f"rooms over {MAX_ROOM_MODULES} modules: {big} (split the room, or move shared code up)"


def test_bench_rooms_import_each_other_only_through_the_shared_modules() -> None:
    """A room uses the shared modules of `aogpt.bench` (common, environment, limits, ...) and library code,
    not another room (except where `ROOM_USES` says so); the shared modules import no room."""
    graph = import_graph()
    wrong = wrong_room_imports(graph)
    assert not wrong, "bench rooms importing each other: " + ", ".join(wrong)
    used = {(room_of(m), room_of(t)) for m, ts in graph.items() for t in ts}
    assert ROOM_USES <= used, f"allowed but unused (drop them): {sorted(ROOM_USES - used)}"
