"""Without django.tasks (Django 5.2): the backend refuses to import, clearly; the rest works."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec

import django
import pytest

from tests.conftest import ROOT

HAS_TASKS = find_spec("django.tasks") is not None


def _import_backend_without_django_tasks():
    # sys.modules[name] = None makes "import name" fail, as on Django 5.2.
    code = (
        "import sys; sys.modules['django.tasks'] = None\n"
        "import django; django.setup()\n"
        "from django_jobs import enqueue, job, registry\n"
        "assert registry.lookup('tests.record') is not None\n"
        "assert 'tests.testapp.tasks' not in sys.modules\n"
        "try:\n"
        "    import django_jobs.backend\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_importing_the_backend_without_django_tasks_says_why():
    message = _import_backend_without_django_tasks()
    assert "django.tasks" in message and "Django 6.0" in message
    assert f"this is Django {django.get_version()}" in message
    assert "@job, enqueue_on_commit" in message


@pytest.mark.skipif(HAS_TASKS, reason="this Django has django.tasks")
def test_on_this_django_the_backend_does_not_import():
    with pytest.raises(ImportError, match="Django 6.0"):
        import django_jobs.backend  # noqa: F401
    assert "tests.testapp.tasks" not in sys.modules


@pytest.mark.skipif(not HAS_TASKS, reason="needs django.tasks (Django >= 6.0)")
def test_apps_tasks_modules_are_autodiscovered():
    # Loaded at django.setup() because TASKS names JobsBackend: workers know every task.
    assert "tests.testapp.tasks" in sys.modules
