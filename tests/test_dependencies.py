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

# declared for what they bring besides an import: none today. A name here needs its reason.
NOT_IMPORTED_ON_PURPOSE: dict[str, str] = {}


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


def _third_party(imported: dict[str, list[str]]) -> dict[str, set[str]]:
    """Distribution (normalised) -> the top-level modules of it that the package imports."""
    dists = packages_distributions()
    out: dict[str, set[str]] = {}
    for top in imported:
        if top == "equipoise" or top in sys.stdlib_module_names:
            continue
        for dist in dists.get(top, [top]):
            out.setdefault(_norm(dist), set()).add(top)
    return out


def test_every_imported_library_is_declared() -> None:
    imported = _imported_top_levels()
    used = _third_party(imported)
    extras = PYPROJECT["project"]["optional-dependencies"]
    # an optional backend (vllm, ray) is imported where it is used and declared in its extra
    declared = _declared(PYPROJECT["project"]["dependencies"])
    optional = _declared([r for name, reqs in extras.items() if name != "dev" for r in reqs])
    missing = {d: sorted(tops) for d, tops in used.items() if d not in declared | optional}
    assert not missing, f"imported by equipoise/ but not declared: {missing}"


def test_every_declared_dependency_is_imported() -> None:
    used = set(_third_party(_imported_top_levels()))
    declared = _declared(PYPROJECT["project"]["dependencies"])
    unused = sorted(declared - used - set(NOT_IMPORTED_ON_PURPOSE))
    assert not unused, (
        f"declared in [project.dependencies] but never imported by equipoise/: {unused}; "
        "a test or benchmark dependency belongs in the dev extra"
    )


def test_what_the_tests_and_benchmarks_import_is_declared() -> None:
    """The cross-checks (scipy, statsmodels, scikit-learn, ...) come from the dev extra or the runtime
    dependencies, so the README's test command installs everything the suite and benchmarks need."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = _declared(PYPROJECT["project"]["dependencies"]) | {
        d for reqs in extras.values() for d in _declared(reqs)
    }
    for folder in ("tests", "benchmarks"):
        used = _third_party(_imported_top_levels(folder))
        missing = {d: sorted(tops) for d, tops in used.items() if d not in declared}
        assert not missing, f"imported under {folder}/ but not declared: {missing}"
