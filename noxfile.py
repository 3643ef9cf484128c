"""Test, lint, type-check and docs sessions. ``nox`` with no arguments runs all four."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import nox

nox.options.sessions = ["lint", "typecheck", "docs", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
CONSTRAINTS = "ci-constraints.txt"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite against real files, a real S3 server, real processes and mpirun."""
    if os.path.exists("tests/setup_system.sh"):
        session.run("bash", "tests/setup_system.sh", external=True)
    session.install("-c", CONSTRAINTS, "-e", ".[test]")
    install_azurite(session)
    session.run("python", "-m", "pytest", *session.posargs)


def install_azurite(session: nox.Session) -> None:
    """Azurite (npm) into the user's cache dir, when Node and npm are there (else its tests skip)."""
    if shutil.which("npm") and shutil.which("node"):
        session.run("python", "-m", "asyncckpt.servers.azurite", "install")


#: the modules a loaded machine breaks first: object stores, faults, stalls, crashes
STRESS_MODULES = ("test_s3_*.py", "test_swift_*.py", "test_*fault*.py", "test_*stall*.py", "test_crash*.py")
HOGS = 2
#: the longer crash-point variant of the reliability issue: at least 50 random kill instants
LONG_INSTANTS = 50
MODULE_RUNS = 10  # consecutive runs of the S3/Swift/fault modules, the whole suite's included


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` busy-looping processes beside the tests (each killed by its own handle after)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@nox.session(python=PYTHON)
def stress(session: nox.Session) -> None:
    """The suite under load (issue 13): two CPU hogs beside it; the whole suite 3 consecutive
    runs, then the S3, Swift and fault modules 7 more times (10 consecutive runs of them
    counting the 3 inside the whole suite), then the crash-point tests at 50 random instants.
    Any failure stops the session. Not a default session: about 2.5 hours on the 2-core VM.
    ``nox -s stress -- ARGS`` passes ARGS to every pytest run."""
    if os.path.exists("tests/setup_system.sh"):
        session.run("bash", "tests/setup_system.sh", external=True)
    session.install("-c", CONSTRAINTS, "-e", ".[test]")
    install_azurite(session)
    modules = sorted({path for pattern in STRESS_MODULES for path in glob.glob(f"tests/{pattern}")})
    with cpu_hogs(HOGS):
        for i in range(3):
            session.log(f"stress: whole suite, run {i + 1} of 3, {HOGS} CPU hogs")
            session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs)
        for i in range(3, MODULE_RUNS):
            session.log(f"stress: S3/Swift/fault modules, run {i + 1} of {MODULE_RUNS}, {HOGS} CPU hogs")
            session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules, *session.posargs)
        session.log(f"stress: crash points at {LONG_INSTANTS} random instants, {HOGS} CPU hogs")
        session.run(
            "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-k", "random_instants", "--timeout=900",
            *sorted(glob.glob("tests/test_crash*.py")), *session.posargs,
            env={"CRASH_INSTANTS": str(LONG_INSTANTS)},
        )  # fmt: skip


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("-c", CONSTRAINTS, "ruff")  # pinned: a new release's rules must not fail CI
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install(
        "-c", CONSTRAINTS, "-e", ".[test,lint]"
    )  # bench modules import boto3/moto when asked for a demo server
    session.run("mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml): ``mkdocs build --strict``, so any warning fails it."""
    session.install("-c", CONSTRAINTS, "-e", ".[docs]")
    site = os.path.join(session.create_tmp(), "site")
    session.run("mkdocs", "build", "--strict", "--site-dir", site, env={"NO_MKDOCS_2_WARNING": "1"})
