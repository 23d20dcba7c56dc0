"""The wheel users install: only django_jobs inside, and it works from a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT

CHECK = ROOT / "tests" / "package" / "check_wheel.py"


def _check(dist):
    return subprocess.run(
        [sys.executable, str(CHECK), str(dist)], capture_output=True, text=True, check=False
    )


@pytest.mark.slow
def test_the_built_wheel_holds_django_jobs_only_and_installs_into_a_fresh_venv(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), ROOT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("django_durable_jobs-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "django_jobs",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    done = _check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the wheel installs and works" in done.stdout


def test_the_wheel_check_refuses_stray_files(tmp_path):
    with zipfile.ZipFile(tmp_path / "django_durable_jobs-0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("django_jobs/__init__.py", "")
        wheel.writestr("tests/settings.py", "")
    done = _check(tmp_path)
    assert done.returncode == 1
    assert "files outside django_jobs/: ['tests/settings.py']" in done.stderr
