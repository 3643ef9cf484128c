"""Options a run would ignore are refused before it starts.

A storage engineer who types ``--mode load --size 10GiB`` or ``--mode save
--num-checkpoints-read 10`` believes the figure they publish was measured that way; the run
silently did something else. Only options given on the command line count: a ``--model``
preset or a ``--config`` file may set load-side defaults for a save-only run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..errors import ConfigError

#: dest → the option, for options that shape what a save measures (a load reads an existing
#: checkpoint; ``--keep`` and ``--no-fsync`` are harmless there, scripts pass them to both)
SAVE_ONLY = {
    "size": "--size",
    "repeat": "--num-checkpoints-write",
    "method": "--method",
}
#: dest → the option, for options only a load uses
LOAD_ONLY = {
    "num_checkpoints_read": "--num-checkpoints-read",
    "verify": "--verify",
    "num_readers": "--num-readers",
    "read_chunk_size": "--read-chunk-size",
    "drop_caches": "--drop-caches",
    "allow_cache": "--allow-cache",
}
#: dest → the option, for options that name each rank's shard (several ranks only)
RANKS_ONLY = {"layout": "--layout", "mkdirs": "--mkdirs"}


def given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options ``argv`` gives: argparse fills in a default only where the
    namespace has no value yet, so a namespace of markers keeps a marker where none was given."""
    unset = object()
    namespace = argparse.Namespace(**{a.dest: unset for a in parser._actions})
    parser.parse_known_args(list(argv), namespace=namespace)
    return {dest for dest, value in vars(namespace).items() if value is not unset}


def check_unused(given_dests: set[str], mode: str, *, shards_named: bool) -> None:
    """ConfigError naming every given option this run would ignore (``mode``: the run's
    phases, however they were chosen; ``shards_named``: several ranks save a synthetic
    checkpoint, one shard each, named by ``--layout``)."""
    unused = []
    if mode == "save":
        unused += [flag for dest, flag in LOAD_ONLY.items() if dest in given_dests]
    if mode == "load":
        unused += [flag for dest, flag in SAVE_ONLY.items() if dest in given_dests]
    if unused:
        phase = "only saves" if mode == "save" else "only loads an existing checkpoint"
        raise ConfigError(f"--mode {mode} {phase}: {', '.join(unused)} would have no effect; leave it out")
    ranks = [flag for dest, flag in RANKS_ONLY.items() if dest in given_dests]
    if ranks and not shards_named:
        verb = "names" if len(ranks) == 1 else "name"
        raise ConfigError(
            f"{', '.join(ranks)} {verb} each rank's shard of a synthetic checkpoint saved under "
            "mpirun or torchrun (a workload names its own objects); this run would ignore it"
        )
