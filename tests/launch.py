"""Real ``torchrun`` / ``mpirun`` runs of a test module (``python -m tests.<child> ...``).

Children get this tree first on ``PYTHONPATH`` and none of the launcher variables the test
process may have inherited, so each rank sees exactly what its own launcher set.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER_PREFIXES = (
    *("OMPI_", "PMI", "SLURM_", "MV2_"),
    *("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "GROUP_", "ROLE_"),
)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def torchrun(
    module: str, *args: str, nproc: int = 2, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node N`` on 127.0.0.1 (c10d rendezvous on a free port)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "--monitor-interval", "0.1", "-m", module, *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, env=child_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def mpirun(module: str, *args: str, np: int = 2, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: run tests/setup_system.sh (installs Open MPI)")
    pytest.importorskip("mpi4py", reason="mpi4py not installed: pip install 'asyncckpt[mpi]'")
    env = child_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", sys.executable, "-m", module, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
