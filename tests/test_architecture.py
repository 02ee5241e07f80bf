"""The layout holds: edges → engines → shared transforms → text stack, never back; no import circles; no
function-local imports of the project's own modules; no folder of more than 15 modules; ruff finds nothing.

The import graph is read from the source (module-level and function-local imports alike), so the test fails
as soon as a circle or a forbidden direction appears, whether or not the import runs."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("adapter", "fhir_transforms", "text_deid", "conformance", "mappings", "prompts")
MAX_MODULES_PER_FOLDER = 15

# (importer prefix, imported prefix): imports that break the one direction data flows in.
FORBIDDEN = [
    ("text_deid", "fhir_transforms"), ("text_deid", "adapter"),          # the text stack knows no engine
    ("fhir_transforms", "adapter"),                                        # engines know no edge
    ("conformance", "fhir_transforms"), ("conformance", "text_deid"),     # the Safe Harbor checks are independent
    ("conformance", "adapter"),
    ("fhir_transforms.r4", "fhir_transforms.hl7v2"),                      # the two engines share only the top
    ("fhir_transforms.hl7v2", "fhir_transforms.r4"),
]
SHARED_TRANSFORMS = "fhir_transforms"  # its top-level modules (pseudonym, dates, keys...) import no engine
CLI_SHARED = {"adapter.cli", "adapter.cli.common", "adapter.cli.auditing"}  # what command modules may share
CLI_ENTRY = {"adapter.cli.main", "adapter.cli.__main__"}  # the group, and `python -m adapter.cli`


def module_files() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def imports(mods: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported project module, inside a function?) for every import statement."""
    found = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # relative: resolve against the importer's package
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                targets = [f"{module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rpartition(".")[0]
                if target in mods and target != name:
                    found.append((name, target, id(node) in in_function))
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return result


def graph() -> tuple[dict[str, Path], list[tuple[str, str, bool]], dict[str, set[str]]]:
    mods = module_files()
    found = imports(mods)
    edges: dict[str, set[str]] = defaultdict(set)
    for module in mods:
        edges[module]
    for importer, imported, _ in found:
        edges[importer].add(imported)
        parts = imported.split(".")  # importing a.b.c runs a/__init__ and a.b/__init__ first
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package in mods and package != importer and not importer.startswith(package + "."):
                edges[importer].add(package)
    return mods, found, edges


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_import_graph_has_no_circle():
    _, _, edges = graph()
    assert circles(edges) == []


def test_imports_flow_one_way():
    _, found, _ = graph()
    wrong = sorted({(a, b) for a, b, _ in found for src, dst in FORBIDDEN if under(a, src) and under(b, dst)})
    assert wrong == []


def test_shared_transforms_import_no_engine():
    _, found, _ = graph()
    top = [(a, b) for a, b, _ in found if a.count(".") == 1 and under(a, SHARED_TRANSFORMS)
           and (under(b, "fhir_transforms.r4") or under(b, "fhir_transforms.hl7v2"))]
    assert top == []


def test_command_modules_never_import_each_other():
    _, found, _ = graph()
    commands = [(a, b) for a, b, _ in found if under(a, "adapter.cli") and under(b, "adapter.cli")
                and a not in CLI_ENTRY and b not in CLI_SHARED | CLI_ENTRY]
    edges_into_cli = [(a, b) for a, b, _ in found if not under(a, "adapter.cli") and under(b, "adapter.cli")]
    assert commands == [] and edges_into_cli == []


def test_no_function_local_import_of_a_project_module():
    """Commands are loaded lazily by name (adapter/cli/main.py), so nothing needs to hide an import."""
    _, found, _ = graph()
    assert sorted({(a, b) for a, b, local in found if local}) == []


def test_no_folder_holds_more_than_15_modules():
    counts = defaultdict(int)
    for path in module_files().values():
        counts[path.parent.relative_to(ROOT).as_posix()] += 1
    assert {folder: n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER} == {}


def test_the_checks_see_a_circle_and_a_wrong_direction(tmp_path, monkeypatch):
    """The graph is real: a planted circle and a text-stack import of an engine are found."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "adapter" / "a.py").write_text("from adapter import b\n")
    (tmp_path / "adapter" / "b.py").write_text("def f():\n    from adapter.a import x\n")
    (tmp_path / "text_deid" / "t.py").write_text("from fhir_transforms import keys\n")
    (tmp_path / "fhir_transforms" / "keys.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _, found, edges = graph()
    assert circles(edges) == [["adapter.a", "adapter.b"]]
    assert ("text_deid.t", "fhir_transforms.keys", False) in found
    assert ("adapter.b", "adapter.a", True) in found


def test_ruff_finds_nothing():
    """ruff comes with the test extra, beside this interpreter; its settings are in pyproject.toml."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    result = subprocess.run([ruff, "check", "--quiet", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
