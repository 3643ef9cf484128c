"""Event-loop lag during a full-speed save: library defaults vs the MLPerf thread rule.

A training loop sharing the event loop feels this lag. Target (issue 12, goal 4): p99 <= 2 ms
during a full-speed save with the library defaults (``AsyncCheckpointer()``, whose thread
budget leaves the event loop a core), while the bench CLI keeps the MLPerf rule (usable CPUs
÷ ranks on this node). Each run is a fresh interpreter (dgen-py's thread pool is sized once
per process), the two rules alternate (A B, then B A, ...), into a file and into null://.
Reported: per-run idle and save lag (ticker every 1 ms), save GB/s, the rule and threads the
result recorded, the verdict on p99 <= 2 ms from the per-run p99 values, and the throughput
cost of leaving a core (GB/s ratio leave_loop_core / mlperf per pair, file and null).

    python benchmarks/bench_loop_lag.py --size 4GiB --dir /var/tmp --repeat 5 [--loop asyncio]
        [--cpu-idle off] [--cpu-pin off] [--busy-cpus 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

from _common import bootstrap_ci, directory, emit, ratio_verdict

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.engine.monitor import LoopMonitor
from asyncckpt.modes import SWITCH, Switch, ThreadBudgetRule, choices

RULES: tuple[str, ...] = choices(ThreadBudgetRule)  # ("leave_loop_core", "mlperf")
LIBRARY_DEFAULT = "leave_loop_core"
TARGET_P99_MS = 2.0
TICK_S = 0.001


async def measure(
    uri: str, size: int, rule: str, idle_s: float, cpu_idle: str, cpu_pin: str
) -> dict[str, Any]:
    """One run: the loop idle, then a warm-up save and the measured save."""
    async with LoopMonitor(TICK_S) as idle:
        await asyncio.sleep(idle_s)
    # the library defaults, with only the ticker made finer; mlperf is what the CLI passes
    options: dict[str, Any] = {"monitor_interval": TICK_S}
    if rule != LIBRARY_DEFAULT:
        options["thread_budget"] = rule
    # "auto": the rule's default (None); cpu_idle "on" puts the lowered threads in SCHED_IDLE
    # (opt-in), cpu_pin "off" leaves them on every CPU (as before 2.4)
    options["cpu_idle"], options["cpu_pin"] = SWITCH[cpu_idle], SWITCH[cpu_pin]
    async with AsyncCheckpointer(**options) as ckpt:
        await ckpt.save(uri, ckpt.config.chunk_size)  # warm-up: pool allocated and touched
        result = await ckpt.save(uri, size)
        await ckpt.delete(uri)
    i, s, m = idle.lag(), result.loop_lag_s, result.metadata
    return {
        "rule": m.thread_budget_rule,
        "threads": m.thread_budget_threads,
        "gen_threads": m.gen_threads,
        "cpu_nice": m.cpu_nice,
        "cpu_idle": m.cpu_idle,
        "cpu_pinned": m.cpu_pinned,
        "idle_p99_ms": i.p99 * 1e3,
        "save_p50_ms": s.p50 * 1e3,
        "save_p99_ms": s.p99 * 1e3,
        "save_max_ms": s.max * 1e3,
        "GBps": result.throughput_bps / 1e9,
        "event_loop": m.event_loop,
    }


def run_loop(loop: str, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def child(args: argparse.Namespace) -> None:
    row = run_loop(
        args.loop,
        measure(args.uri, parse_size(args.size), args.rule, args.idle, args.cpu_idle, args.cpu_pin),
    )
    print(json.dumps(row))


@contextlib.contextmanager
def busy_cpus(n: int) -> Iterator[None]:
    """``n`` busy-loop processes at normal priority beside a run: what the lowered threads get
    when every CPU is wanted elsewhere (a CPU-bound training step, data-loader workers)."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


def one_run(uri: str, rule: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--uri", uri, "--rule", rule, "--size", args.size]
    cmd += [
        "--loop",
        args.loop,
        "--idle",
        str(args.idle),
        "--cpu-idle",
        args.cpu_idle,
        "--cpu-pin",
        args.cpu_pin,
    ]
    with busy_cpus(args.busy_cpus):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({rule}, {uri}):\n{proc.stderr}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if row["rule"] != rule:
        raise SystemExit(f"asked for the {rule} rule, the result recorded {row['rule']}")
    return row


def summarize(rows: list[dict[str, Any]], targets: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in targets:
        by = {r: [x for x in rows if x["target"] == target and x["rule"] == r] for r in RULES}
        lag = {
            rule: {
                "p99_ms_per_run": [round(x["save_p99_ms"], 3) for x in runs],
                "median_p99_ms": round(statistics.median(x["save_p99_ms"] for x in runs), 3),
                "median_GBps": round(statistics.median(x["GBps"] for x in runs), 3),
                # ratio p99 / 2 ms per run; "met" only when the whole 95 % interval is <= 1
                "p99_le_2ms": ratio_verdict(
                    [x["save_p99_ms"] / TARGET_P99_MS for x in runs], 1.0, at_most=True
                ),
            }
            for rule, runs in by.items()
        }
        ratios = [a["GBps"] / b["GBps"] for a, b in zip(by[LIBRARY_DEFAULT], by["mlperf"], strict=True)]
        low, high = bootstrap_ci(ratios)
        out[target] = {
            "lag": lag,
            "throughput_leave_over_mlperf": {
                "ratios": [round(r, 4) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 4),
                "ci95": [round(low, 4), round(high, 4)],
            },
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="4GiB")
    p.add_argument(
        "--dir", type=directory, default="/var/tmp", help="where the file target is written (/var/tmp)"
    )
    p.add_argument("--targets", default="file,null", help="file, null or both (file,null)")
    p.add_argument("--repeat", type=int, default=5, help="alternating pairs per target (>= 5)")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--idle", type=float, default=0.5, help="seconds of idle-loop lag per run")
    p.add_argument(
        "--busy-cpus",
        type=int,
        default=0,
        help="busy-loop processes beside each run (the CPU the lowered threads get under load)",
    )
    p.add_argument(
        "--cpu-idle",
        choices=choices(Switch),
        default="auto",
        help="cpu_idle for both rules (auto: each rule's default; off: niceness alone, as before 2.3)",
    )
    p.add_argument(
        "--cpu-pin",
        choices=choices(Switch),
        default="auto",
        help="cpu_pin for both rules (auto: each rule's default; off: on every CPU, as before 2.4)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--rule", choices=RULES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or not set(targets) <= {"file", "null"}:
        p.error("--targets: file, null or file,null")
    if args.repeat < 5:
        p.error("--repeat: a verdict needs at least 5 alternating pairs")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-lag-") as tmp:
        for i in range(args.repeat):
            order = RULES if i % 2 == 0 else RULES[::-1]  # A B, B A: drift does not favour one rule
            for target in targets:
                uri = str(Path(tmp) / "ckpt.bin") if target == "file" else "null://lag"
                for rule in order:
                    rows.append({"repeat": i, "target": target, **one_run(uri, rule, args)})
                    print(
                        f"# {i} {target} {rule}: p99 {rows[-1]['save_p99_ms']:.2f} ms, "
                        f"{rows[-1]['GBps']:.2f} GB/s",
                        file=sys.stderr,
                    )
    summary = summarize(rows, targets)
    emit(
        "loop_lag",
        rows,
        ("repeat", "target", "rule", "threads", "gen_threads", "cpu_nice", "cpu_idle", "cpu_pinned",
         "idle_p99_ms", "save_p50_ms", "save_p99_ms", "save_max_ms", "GBps"),
        {
            "size_bytes": parse_size(args.size),
            "loop": args.loop,
            "cpu_idle": args.cpu_idle,
            "cpu_pin": args.cpu_pin,
            "busy_cpus": args.busy_cpus,
            "tick_s": TICK_S,
            "target_p99_ms": TARGET_P99_MS,
            "library_default_rule": LIBRARY_DEFAULT,
            "summary": summary,
        },
    )  # fmt: skip
    for target, s in summary.items():
        for rule, lag in s["lag"].items():
            v = lag["p99_le_2ms"]
            print(
                f"{target:4} {rule:15} p99 median {lag['median_p99_ms']:.2f} ms "
                f"(ratio to 2 ms {v['median_ratio']:.3f}, CI {v['ci95']}): {v['verdict']}; "
                f"{lag['median_GBps']:.2f} GB/s"
            )
        t = s["throughput_leave_over_mlperf"]
        print(f"{target:4} throughput leave_loop_core / mlperf: {t['median_ratio']:.3f} (CI {t['ci95']})")


if __name__ == "__main__":
    main()
