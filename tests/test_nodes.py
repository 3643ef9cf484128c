"""Real nodes on one machine (issue 26's test bed, tests/nodes.py): two network namespaces,
each with its own node-local directory, torchrun and mpirun jobs spanning both, the store on
the bridge.

Root only: elsewhere every test here skips with the reason (``nox -s nodes`` runs just them).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from asyncckpt.servers.s3endpoint import S3Endpoint

from . import nodes
from .launch import ROOT, child_env

pytestmark = [pytest.mark.nodes, pytest.mark.timeout(300)]  # a job's setup is 15-30 s on a busy VM

JOB_TIMEOUT_S = 120  # 2 agents + 4 ranks importing torch on 2 shared cores


def start(node: nodes.Node, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        node.command(argv), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float) -> None:
    """Wait for ``procs``; any that fails (or hangs: the bed's teardown kills it) fails the test."""
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:  # (what they started inside the nodes dies with the bed)
                p.kill()
                p.communicate()
            raise
        if proc.returncode != 0:
            errors.append(f"rc {proc.returncode}: {err[-3000:]}")
    assert not errors, "\n".join(errors)


def python(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.nodes_child", *args]


def torchrun_on(bed: nodes.Bed, job: list[str]) -> list[tuple[nodes.Node, list[str]]]:
    pytest.importorskip("torch", reason="torch not installed: pip install 'asyncckpt[torch]'")
    return nodes.torchrun_commands(bed, [*job, "torch"])


def mpirun_on(bed: nodes.Bed, job: list[str]) -> list[tuple[nodes.Node, list[str]]]:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: run tests/setup_system.sh (installs Open MPI)")
    pytest.importorskip("mpi4py", reason="mpi4py not installed: pip install 'asyncckpt[mpi]'")
    return [nodes.mpirun_command(bed, [sys.executable, *job, "mpi"])]


LAUNCHERS = {"torchrun": torchrun_on, "mpirun": mpirun_on}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def job(
    request: pytest.FixtureRequest,
    node_bed: nodes.Bed,
    bed_store: tuple[S3Endpoint, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """One job of 2 nodes x 2 ranks (torchrun or mpirun), then a 1-node reload of its step."""
    launcher: str = request.param
    ep, bucket = bed_store
    out = tmp_path_factory.mktemp(f"nodes-{launcher}")
    root, local = f"s3://{bucket}/{launcher}", node_bed.local / launcher
    for node in node_bed.nodes:  # the job's own directory on each node's disk
        (node.disk / launcher).mkdir()
    env = child_env(**ep.env(), AWS_EC2_METADATA_DISABLED="true", **nodes.MPI_ROOT_ENV)
    argv = ["-m", "tests.nodes_child", "job", str(out), str(local), root]  # python's arguments
    finish([start(node, cmd, env) for node, cmd in LAUNCHERS[launcher](node_bed, argv)], JOB_TIMEOUT_S)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    finish([start(node_bed.nodes[1], python("reload", str(out), root, "4"), env)], 60)
    reload = json.loads((out / "reload.json").read_text())
    return {"launcher": launcher, "ranks": ranks, "reload": reload}


def test_every_rank_sees_its_node(job: dict[str, Any]) -> None:
    ranks = job["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world"] for r in ranks} == {4}
    torch = job["launcher"] == "torchrun"
    assert {r["backend"] for r in ranks} == {"torch" if torch else "mpi"}
    hosts = {r["hostname"] for r in ranks}
    assert hosts == {"node-a", "node-b"}  # two nodes: each rank's own UTS name
    for host in hosts:
        mine = [r for r in ranks if r["hostname"] == host]
        assert [r["local_rank"] for r in mine] == [0, 1]  # consecutive global ranks per node
        assert [r["rank"] for r in mine] == [mine[0]["rank"], mine[0]["rank"] + 1]
        if torch:  # the node rank the c10d rendezvous gave this node
            assert {r["group_rank"] for r in mine} == {mine[0]["rank"] // 2}
    source = "LOCAL_WORLD_SIZE" if torch else "mpi4py COMM_TYPE_SHARED, 2 sharing this CPU set"
    for r in ranks:
        assert r["local_ranks"] == [2, source]  # ranks on this node, not the world (4)
        assert r["budget_local_ranks"] == 2  # the generator's divisor (the seed bug divided by 4)
        assert r["comm"] == {
            "rank": r["rank"], "size": 4, "local_rank": r["local_rank"], "local_size": 2,
            "launcher": "torchrun" if torch else "mpi",
        }  # fmt: skip
        assert r["world"] // r["local_ranks"][0] == len(hosts) == 2  # node count


def test_each_node_sees_only_its_own_local_directory(job: dict[str, Any], node_bed: nodes.Bed) -> None:
    ranks = job["ranks"]
    for r in ranks:  # listed by each rank at the same path, after every rank had saved there
        peers = [p["rank"] for p in ranks if p["hostname"] == r["hostname"]]
        assert r["seen_local"] == [f"rank{p}.safetensors" for p in peers]
    for node in node_bed.nodes:  # and from the root namespace, in each node's own directory
        peers = [p["rank"] for p in ranks if p["hostname"] == node.hostname]
        names = sorted(p.name for p in (node.disk / job["launcher"]).iterdir())
        assert names == [f"rank{p}.safetensors" for p in peers]
    assert not list(node_bed.local.iterdir())  # the shared path itself holds nothing outside a node


def test_save_step_from_both_nodes_commits_and_one_node_reload_verifies(job: dict[str, Any]) -> None:
    names = [f"rank-{r}-of-4.safetensors" for r in range(4)]
    assert [r["committed"] for r in job["ranks"]] == [names] * 4
    assert job["reload"] == {"step": 1, "world": 4, "objects": names, "verified": [True] * 4}


def test_a_tiered_job_drains_every_node_and_a_lost_node_restores_from_the_remote(
    node_bed: nodes.Bed, bed_store: tuple[S3Endpoint, str], tmp_path: Path
) -> None:
    """Issue 26 across real nodes: each node's local tier (one path, each node's own disk)
    holds only its ranks' objects and the step's commit record; the remote holds every rank's.
    Node A's disk is wiped: its ranks restore the newest step from the remote, node B's from
    their own disk, all with the saved values."""
    ep, bucket = bed_store
    local = node_bed.local / "tiers"
    for node in node_bed.nodes:
        (node.disk / "tiers").mkdir()
    env = child_env(**ep.env(), AWS_EC2_METADATA_DISABLED="true", **nodes.MPI_ROOT_ENV)
    job = ["-m", "tests.nodes_child", "tiers", str(tmp_path), str(local), f"s3://{bucket}/tiers"]
    finish([start(n, cmd, env) for n, cmd in mpirun_on(node_bed, [*job, "save"])], JOB_TIMEOUT_S)
    saved = [json.loads((tmp_path / f"tiers-save-{r}.json").read_text()) for r in range(4)]
    assert saved[0]["tiers"]["remote_committed"] == [1, 2]
    hosts = {r["hostname"]: [p["rank"] for p in saved if p["hostname"] == r["hostname"]] for r in saved}
    for r in saved:  # keep_local=1: step 2 only, this node's objects only
        objects = [n for n in r["local"] if n.endswith(".safetensors")]
        assert objects == [f"step-2/rank-{p}-of-4.safetensors" for p in hosts[r["hostname"]]]
        assert "step-2/COMMITTED.json" in r["local"] and not any(n.startswith("step-1") for n in r["local"])
    lost = next(n for n in node_bed.nodes if n.hostname == saved[0]["hostname"])
    shutil.rmtree(lost.disk / "tiers")  # node A is replaced: an empty local disk
    (lost.disk / "tiers").mkdir()
    finish([start(n, cmd, env) for n, cmd in mpirun_on(node_bed, [*job, "restore"])], JOB_TIMEOUT_S)
    restored = [json.loads((tmp_path / f"tiers-restore-{r}.json").read_text()) for r in range(4)]
    for r in restored:
        tier = "remote" if r["hostname"] == lost.hostname else "local"
        assert (r["step"], r["equal"], r["tiers"]["restored_from"][0]) == (2, True, tier), r


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_lost_node_restores_from_its_peers_replica_without_the_remote(
    launcher: str, node_bed: nodes.Bed, tmp_path: Path
) -> None:
    """Issue 26's optional part across real nodes: with ``replicate_to_peer=True`` each rank's
    object of a step also lands in the next node's local tier, over the job's own transport
    (gloo's TCP or Open MPI's, between the namespaces). Node A's disk is wiped and the remote
    loses the newest step: node A's ranks get it back from node B's replicas, verified, and
    every rank restores that step with the saved values."""
    local = node_bed.local / f"peer-{launcher}"
    for node in node_bed.nodes:
        (node.disk / f"peer-{launcher}").mkdir()
    remote = tmp_path / "remote"  # a directory both nodes see (only the bind-mounted path is per node)
    env = child_env(**nodes.MPI_ROOT_ENV)
    job = ["-m", "tests.nodes_child", "tiers", str(tmp_path), str(local), str(remote)]
    finish([start(n, c, env) for n, c in LAUNCHERS[launcher](node_bed, [*job, "save-peer"])], JOB_TIMEOUT_S)
    saved = [json.loads((tmp_path / f"tiers-save-peer-{r}.json").read_text()) for r in range(4)]
    every = [f"step-2/rank-{p}-of-4.safetensors" for p in range(4)]
    for r in saved:  # its node's ranks' objects, and the other node's as replicas
        assert [n for n in r["local"] if n.endswith(".safetensors")] == every, r["local"]
        assert "step-2/asyncckpt-index.json" in r["local"]  # rank 0's node's file, on every node
        assert r["tiers"]["replica_failures"] == []
        steps_of = {s["step"]: s for s in r["tiers"]["steps"]}
        peer = next(
            p["rank"] for p in saved if p["hostname"] != r["hostname"] and p["rank"] % 2 == r["rank"] % 2
        )
        assert {steps_of[s]["replicated_to"] for s in (1, 2)} == {peer}
        assert steps_of[2]["bytes_replicated"] > 400_000
    lost = next(n for n in node_bed.nodes if n.hostname == saved[0]["hostname"])
    kept = next(n for n in node_bed.nodes if n is not lost)

    def restore() -> list[dict[str, Any]]:
        shutil.rmtree(lost.disk / f"peer-{launcher}")  # node A is replaced: an empty local disk
        (lost.disk / f"peer-{launcher}").mkdir()
        phase = [*job, "restore-peer"]
        finish([start(n, c, env) for n, c in LAUNCHERS[launcher](node_bed, phase)], JOB_TIMEOUT_S)
        return [json.loads((tmp_path / f"tiers-restore-peer-{r}.json").read_text()) for r in range(4)]

    shutil.move(remote / "step-2", tmp_path / "aside")  # the remote has only step 1
    for r in restore():
        tier = "peer" if r["hostname"] == lost.hostname else "local"
        assert (r["step"], r["equal"], r["tiers"]["restored_from"][0]) == (2, True, tier), r
        if tier == "peer":  # fetched back with the step's commit record: a local step again
            assert {"step-2/COMMITTED.json", "step-2/asyncckpt-index.json"} <= set(r["local"])
            assert f"step-2/rank-{r['rank']}-of-4.safetensors" in r["local"]
    # node A has its own objects back but not node B's replicas, and the remote lacks step 2:
    # the next start makes the replicas again and drains step 2 again, by themselves
    shutil.rmtree(tmp_path / "aside")
    finish([start(n, c, env) for n, c in LAUNCHERS[launcher](node_bed, [*job, "resume-peer"])], JOB_TIMEOUT_S)
    for r in (json.loads((tmp_path / f"tiers-resume-peer-{r}.json").read_text()) for r in range(4)):
        assert r["tiers"]["replicas_resumed"] == [2] and r["tiers"]["replica_failures"] == [], r["tiers"]
        assert r["tiers"]["resumed"] == [2], r["tiers"]  # the drain
        assert [n for n in r["local"] if n.endswith(".safetensors")] == every, r["local"]
    assert (remote / "step-2" / "COMMITTED.json").exists()  # drained from node A's fetched copy
    # node B's replica of rank 0 is corrupt, the remote has step 2 again: rank 0 falls back to it
    corrupt = kept.disk / f"peer-{launcher}" / "step-2" / "rank-0-of-4.safetensors"
    with corrupt.open("r+b") as f:
        f.seek(corrupt.stat().st_size - 100)
        f.write(b"\xff" * 8)
    for r in restore():
        tier = {0: "remote", 1: "peer"}.get(r["rank"], "local")
        assert (r["step"], r["equal"], r["tiers"]["restored_from"][0]) == (2, True, tier), r
        if r["rank"] == 0:
            assert "ChecksumMismatchError" in r["tiers"]["restored_from"][1]


def test_deleting_one_nodes_local_directory_leaves_the_other(fresh_bed: nodes.Bed, tmp_path: Path) -> None:
    env, local = child_env(), str(fresh_bed.local)
    a, b = fresh_bed.nodes
    finish([start(n, python("local-save", local, str(i + 10)), env) for i, n in enumerate((a, b))], 60)
    # node A loses its local disk's contents (what a replaced or wiped node looks like)
    finish([start(a, ["find", local, "-mindepth", "1", "-delete"], env)], 30)
    outs = {n.name: tmp_path / f"{n.name}.json" for n in (a, b)}
    finish([start(n, python("local-load", str(outs[n.name]), local), env) for n in (a, b)], 60)
    got = {name: json.loads(path.read_text()) for name, path in outs.items()}
    assert got["b"] == {"tag": 11, "ok": True, "listing": ["state.safetensors"]}  # verified, untouched
    assert got["a"]["listing"] == [] and got["a"]["error"] == "TargetNotFoundError", got["a"]
    assert not list(a.disk.iterdir()) and [p.name for p in b.disk.iterdir()] == ["state.safetensors"]


def test_both_nodes_reach_swift_on_the_bridge(node_bed: nodes.Bed, bed_swift: tuple[S3Endpoint, str]) -> None:
    """The real object store too: each node saves an object to Swift, the other loads it verified."""
    ep, bucket = bed_swift
    env = child_env(**ep.env(), AWS_EC2_METADATA_DISABLED="true")
    uris = {n.name: f"s3://{bucket}/{n.hostname}.safetensors" for n in node_bed.nodes}
    a, b = node_bed.nodes
    finish([start(n, python("put", uris[n.name], str(i)), env) for i, n in enumerate((a, b))], 60)
    finish(
        [start(a, python("check", uris["b"], "1"), env), start(b, python("check", uris["a"], "0"), env)], 60
    )


def test_teardown_kills_node_processes_and_leaves_nothing() -> None:
    reason = nodes.unavailable()
    if reason is not None:
        pytest.skip(f"two-node bed unavailable: {reason}")
    made, lock = nodes.create()
    try:
        procs = [start(n, ["sh", "-c", "echo up; exec sleep 1000"], child_env()) for n in made.nodes]
        for proc in procs:  # each is running inside its node before the teardown
            assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert all(n.pids() for n in made.nodes)
    finally:
        nodes.destroy(made, lock)
    assert [proc.wait(timeout=10) for proc in procs] == [-signal.SIGKILL] * 2
    for proc in procs:
        proc.communicate()
    assert nodes.leftovers(made.id) == []


def test_a_killed_run_leaves_no_job_and_the_sweeper_removes_its_bed() -> None:
    reason = nodes.unavailable()
    if reason is not None:
        pytest.skip(f"two-node bed unavailable: {reason}")
    code = (  # a test run that built a bed and started a job on node a
        "import subprocess, sys\nfrom tests import nodes\nbed, lock = nodes.create()\n"
        "argv = bed.nodes[0].command(['sh', '-c', 'echo up; exec sleep 1000'])\n"
        "job = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)\n"
        "assert job.stdout.readline() == 'up\\n'\n"
        "print(bed.id, job.pid, flush=True)\nsys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    bed_id, pid = proc.stdout.readline().split()  # the bed is complete, its creator holds it
    job = os.pidfd_open(int(pid))  # the job inside node a
    try:
        assert nodes.leftovers(bed_id) and bed_id not in nodes.stale_beds()  # a live bed is never swept
    finally:
        proc.kill()  # SIGKILL, no finalizer runs: what a killed test run leaves behind
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.stdout.close()
    try:
        ended = select.select([job], [], [], 10)[0]  # the job dies with its starter (pdeathsig)
        os.close(job)
        assert ended, "the job on node a outlived the killed test run"
        assert nodes.leftovers(bed_id)
        assert bed_id in nodes.sweep_stale()
        assert nodes.leftovers(bed_id) == []
    finally:
        nodes.destroy_names(bed_id)  # (a no-op once swept)


def test_without_cap_net_admin_every_node_test_skips_with_the_reason() -> None:
    """The module run again by a root whose capabilities lack CAP_NET_ADMIN (a container's
    root, say): every test skips, naming the capability; none errors or leaves anything."""
    if nodes.unavailable() is not None or shutil.which("setpriv") is None:
        pytest.skip("needs root with CAP_NET_ADMIN and setpriv (util-linux) to take it away")
    drop = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin", "--"]
    pytest_args = ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_nodes.py"]
    argv = [*drop, sys.executable, *pytest_args, "-k", "not without_cap"]
    proc = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "error" not in summary, summary
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("root without CAP_NET_ADMIN" in line for line in skips), skips
