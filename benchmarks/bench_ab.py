"""A/B: save and load throughput of two commits, alternating, several pairs, medians.

Each commit is checked out in a temporary git worktree and run through the bench CLI
(``python -m asyncckpt.bench TARGET --mode both``) in a fresh process with that tree first on
``PYTHONPATH``; runs alternate A B, B A, ... so a drifting disk or a busy neighbour hits both
sides alike. Prints a table and one JSON document. Example, before/after a change:

    python benchmarks/bench_ab.py --base HEAD~3 --new HEAD --target /var/tmp --size 2GiB --pairs 5

``--target s3`` starts the discard endpoint beside it (``s3_discard_server.py``) and measures
the S3 client path (``--backend`` picks the library); ``null://`` measures the pipeline alone. Loads are
measured for directories only (nothing is stored elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree(ref: str, parent: Path) -> Iterator[Path]:
    """``ref`` checked out (detached) in a temporary worktree, removed afterwards."""
    path = parent / ref.replace("/", "_").replace("~", "-")
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path), ref], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


@contextlib.contextmanager
def discard_endpoint() -> Iterator[str]:
    """The discard-everything S3 endpoint of the S3 benchmarks, on 127.0.0.1."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "s3_discard_server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1]  # it prints "ENDPOINT http://127.0.0.1:PORT" first
    finally:
        proc.kill()
        proc.wait()


def run_once(tree: Path, args: argparse.Namespace, target: str, endpoint: str | None) -> dict[str, float]:
    """One bench run of ``tree``: median save and load GB/s over its repeats."""
    on_disk = "://" not in target
    with tempfile.TemporaryDirectory(dir=target if on_disk else args.scratch) as d:
        out = Path(d) / "r.json"
        where = (
            str(Path(d) / "ab.bin")
            if on_disk
            else f"{target}{'' if target.endswith('/') else '/'}ab-{os.getpid()}.bin"
        )
        cmd = [sys.executable, "-m", "asyncckpt.bench", where, "--size", args.size, "-q", "--json", str(out)]
        cmd += ["--mode", "both" if on_disk else "save", "--num-checkpoints-write", str(args.repeat)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        if endpoint:
            cmd += ["--backend", args.backend, "--endpoint", endpoint]
            env.update(AWS_ACCESS_KEY_ID="ab", AWS_SECRET_ACCESS_KEY="ab")
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed in {tree}:\n{done.stderr[-2000:]}")
        doc = json.loads(out.read_text())
    rates: dict[str, list[float]] = {"save": [], "load": []}
    for r in doc["results"]:
        if r.get("operation") in rates:
            rates[r["operation"]].append(r["size_bytes"] / r["wall_s"] / 1e9)
    return {op: statistics.median(v) for op, v in rates.items() if v}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git ref of A (the baseline)")
    p.add_argument("--new", default="HEAD", help="git ref of B (default HEAD)")
    p.add_argument("--target", default="/var/tmp", help="a directory, null://, or s3 (discard endpoint)")
    p.add_argument("--backend", default="aiobotocore", help="S3 library for --target s3")
    p.add_argument("--size", default="2GiB")
    p.add_argument("--repeat", type=int, default=3, help="saves (and loads) per run")
    p.add_argument("--pairs", type=int, default=5, help="A/B pairs, alternating order")
    p.add_argument("--scratch", default="/var/tmp", help="where worktrees and result files go")
    args = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with contextlib.ExitStack() as stack:
        parent = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.scratch)))
        trees = {
            side: stack.enter_context(worktree(ref, parent))
            for side, ref in (("A", args.base), ("B", args.new))
        }
        endpoint, target = None, args.target
        if args.target == "s3":
            endpoint, target = stack.enter_context(discard_endpoint()), "s3://ab-bench"
        for i in range(args.pairs):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                runs[side].append(run_once(trees[side], args, target, endpoint))
                print(f"pair {i + 1} {side}: {runs[side][-1]}", file=sys.stderr)
    report: dict[str, object] = {"base": args.base, "new": args.new, "target": args.target, "size": args.size}
    print(f"| op | A {args.base} GB/s (median) | B {args.new} GB/s (median) | B/A | A range | B range |")
    print("| --- | --- | --- | --- | --- | --- |")
    for op in ("save", "load"):
        a = [r[op] for r in runs["A"] if op in r]
        b = [r[op] for r in runs["B"] if op in r]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        report[op] = {"A": a, "B": b, "A_median": ma, "B_median": mb, "ratio": mb / ma}
        spread = f"{min(a):.3f}–{max(a):.3f} | {min(b):.3f}–{max(b):.3f}"
        print(f"| {op} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} | {spread} |")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
