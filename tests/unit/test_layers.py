"""The frontend's import floor: loading the app imports neither Celery, kombu nor an engine."""

from __future__ import annotations

import subprocess
import sys


def test_the_frontend_does_not_import_celery_or_workers() -> None:
    probe = (
        "import sys, app.main\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'celery', 'kombu', 'workers', 'vllm', 'torch'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"the frontend imported: {out.stdout.strip()}"
