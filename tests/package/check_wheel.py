"""Check a built wheel as a user gets it: its files, then an install into a fresh venv.

    python tests/package/check_wheel.py DIST_DIR

Finds the one wheel in DIST_DIR, fails unless it holds only the django_jobs package
(no tests/, example_project/, bench/), installs it with its dependencies into a new
venv outside the checkout, and runs `django check`, `migrate` and `runjobs --burst`
there with package_settings.py (beside this file), so that django_jobs is imported
from the wheel and nowhere else. Exits non-zero with the reason on the first failure.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import venv
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
# What a wheel must ship besides Python modules: the admin's templates and static files,
# the migrations, and the type marker.
REQUIRED = (
    "django_jobs/py.typed",
    "django_jobs/migrations/0001_initial.py",
    "django_jobs/templates/admin/django_jobs/dashboard.html",
)


def fail(message: str) -> None:
    sys.exit(f"check_wheel: {message}")


def check_files(wheel: str) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if not n.startswith("django_jobs/") and ".dist-info/" not in n]
    if stray:
        fail(f"{os.path.basename(wheel)} holds files outside django_jobs/: {stray[:10]}")
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        fail(f"{os.path.basename(wheel)} lacks {missing}")
    if not any(n.startswith("django_jobs/static/") for n in names):
        fail(f"{os.path.basename(wheel)} lacks the admin's static files")
    print(f"check_wheel: {os.path.basename(wheel)}: {len(names)} files, all under django_jobs/")


def run(python: str, *args: str, cwd: str, env: dict[str, str]) -> None:
    command = [python, *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        fail(f"`{' '.join(args)}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
    print(f"check_wheel: `{' '.join(args[:4])}` ok")


def main() -> None:
    if len(sys.argv) != 2:
        fail("usage: check_wheel.py DIST_DIR")
    wheels = glob.glob(os.path.join(sys.argv[1], "*.whl"))
    if len(wheels) != 1:
        fail(f"expected one wheel in {sys.argv[1]}, found {wheels}")
    wheel = os.path.abspath(wheels[0])
    check_files(wheel)
    with tempfile.TemporaryDirectory(prefix="django-jobs-wheel-") as tmp:
        venv.create(os.path.join(tmp, "venv"), with_pip=True)
        python = os.path.join(tmp, "venv", "bin", "python")
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
        }
        run(python, "-m", "pip", "install", "--quiet", wheel, cwd=tmp, env=env)
        # Only this folder on the path: django_jobs can come from the wheel alone.
        env.update(
            PYTHONPATH=HERE,
            DJANGO_SETTINGS_MODULE="package_settings",
            PACKAGE_DB=os.path.join(tmp, "db.sqlite3"),
        )
        origin = "import django_jobs; print(django_jobs.__file__)"
        where = subprocess.run(
            [python, "-c", origin], cwd=tmp, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        if not where.startswith(os.path.join(tmp, "venv")):
            fail(f"django_jobs was imported from {where}, not from the installed wheel")
        run(python, "-m", "django", "check", "--fail-level", "WARNING", cwd=tmp, env=env)
        run(python, "-m", "django", "migrate", "--verbosity", "0", cwd=tmp, env=env)
        run(python, "-m", "django", "runjobs", "--burst", "--verbosity", "0", cwd=tmp, env=env)
    print("check_wheel: the wheel installs and works")


if __name__ == "__main__":
    main()
