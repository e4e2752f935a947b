"""The runtime dependencies in pyproject.toml are what the package imports: every third-party module
that a file under ``equipoise/`` imports (at the top or inside a function) comes from a declared
distribution, and every declared distribution is imported by the package. Test-only and
benchmark-only libraries (the independent cross-checks: scipy, statsmodels, ...) belong in the
``dev`` extra, where a user who only runs the package does not pay for them."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(requirements: list[str]) -> set[str]:
    return {_norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in requirements}


def _imported_top_levels(folder: str = "equipoise") -> dict[str, list[str]]:
    """Top-level module name -> the files under ``folder`` importing it (absolute imports only;
    a folder's own modules, e.g. benchmarks/procstats.py, are left out)."""
    found: dict[str, list[str]] = {}
    own = {folder} | {p.stem for p in (ROOT / folder).rglob("*.py")}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if folder != "equipoise" and name.split(".")[0] in own:
                    continue
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def _providers(imported: dict[str, list[str]]) -> dict[str, set[str]]:
    """Third-party top-level module -> the distributions (normalised) that install it: any one of
    them declared is enough. A module not installed here (vllm, torch) is taken to be the
    distribution of its own name."""
    dists = packages_distributions()
    return {
        top: {_norm(d) for d in dists.get(top, [top])}
        for top in imported
        if top != "equipoise" and top not in sys.stdlib_module_names
    }


def _undeclared(imported: dict[str, list[str]], declared: set[str]) -> dict[str, list[str]]:
    """The imported modules none of whose distributions is declared, with the files importing them."""
    return {top: imported[top] for top, ds in _providers(imported).items() if not ds & declared}


def test_every_imported_library_is_declared() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    # an optional part (the vllm backend, Pillow for images, the Ray sweep) is imported where it is
    # used and declared in its extra
    declared = _declared(PYPROJECT["project"]["dependencies"])
    optional = _declared([r for name, reqs in extras.items() if name != "dev" for r in reqs])
    missing = _undeclared(_imported_top_levels(), declared | optional)
    assert not missing, f"imported by equipoise/ but not declared: {missing}"


def test_every_declared_dependency_is_imported() -> None:
    used = set().union(*_providers(_imported_top_levels()).values())
    declared = _declared(PYPROJECT["project"]["dependencies"])
    unused = sorted(declared - used)
    assert not unused, (
        f"declared in [project.dependencies] but never imported by equipoise/: {unused}; "
        "a test or benchmark dependency belongs in the dev extra"
    )


def test_what_the_tests_and_benchmarks_import_is_declared() -> None:
    """The cross-checks (scipy, statsmodels, scikit-learn, ...) are declared, in the dev extra or as
    runtime dependencies. (What only an optional extra brings, e.g. vllm for the GPU benchmark, is
    declared there; the README's test command installs the dev extra, and the tests that need vllm
    skip without it.)"""
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = _declared(PYPROJECT["project"]["dependencies"]) | {
        d for reqs in extras.values() for d in _declared(reqs)
    }
    for folder in ("tests", "benchmarks"):
        missing = _undeclared(_imported_top_levels(folder), declared)
        assert not missing, f"imported under {folder}/ but not declared: {missing}"
