"""Import floors: loading the app imports neither Celery, kombu nor an engine, and each package imports
only the packages below it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def test_the_frontend_does_not_import_celery_or_workers() -> None:
    probe = (
        "import sys, app.main\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'celery', 'kombu', 'workers', 'vllm', 'torch'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"the frontend imported: {out.stdout.strip()}"


#: What each package of the tree may import of the others (docs/architecture.md): imports point down.
ALLOWED = {
    "core": set(),
    "router": {"core"},
    "workers": {"core", "router"},
    "app": {"core", "router"},
    "sluice": {"core", "router", "workers", "app"},
    "bench": {"core", "router", "workers", "app", "sluice"},
}
OURS = {*ALLOWED, "tests"}


def _imports(path: Path) -> set[str]:
    """The project's top-level packages a module imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


def test_every_package_imports_only_the_floors_below_it() -> None:
    root = Path(__file__).resolve().parents[2]
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            bad = _imports(path) - allowed - {package}
            if bad:
                wrong.append(f"{path.relative_to(root)} imports {', '.join(sorted(bad))}")
    assert wrong == []
