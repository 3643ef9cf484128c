"""Test, lint and type-check sessions. ``nox`` with no arguments runs all three."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
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
    session.run("python", "-m", "pytest", *session.posargs)


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
