"""Run upstream's training script in this process with its schedule's compute timers switched on.

Megatron-DeepSpeed's non-pipelined schedule (``megatron/core/pipeline_parallel/schedules.py``)
times each micro-batch's ``forward-compute`` and ``backward-compute`` (timers of
``--timing-log-level 2``) through the ``timers`` of the config it reads from the model
(``get_model_config``). ``megatron/training.py`` gives its timers to a config of its own, never
to the model's, so under DeepSpeed those timers are never started and the ``times across ranks``
block holds no ``forward-compute`` or ``backward-compute`` whatever the level. Between the
collectives of an iteration these two timers are a rank's own work, which is where a slow node
shows as one rank (``docs/metrics.md``, Stragglers).

The launchers name the script as ``python -u launchers/run/schedule_timers.py <script> <args>``
(spec field ``schedule_timers``, on with ``--timers all``); this module makes the schedule's
``get_model_config`` hand the model's config Megatron's global timers when it has none, then
runs ``<script>`` as ``__main__`` with ``<args>``, as ``python <script> <args>`` would (its
directory first on ``sys.path``). Nothing else of upstream changes: the timers are upstream's,
started and stopped where upstream's schedule starts and stops them, printed by upstream's
``training_log`` with the others.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

SCHEDULES_MODULE = "megatron.core.pipeline_parallel.schedules"
"""Upstream's module whose ``get_model_config`` the schedule calls for the config it times with."""


def with_global_timers(
    get_model_config: Callable[[Any], Any], get_timers: Callable[[], Any]
) -> Callable[[Any], Any]:
    """``get_model_config`` whose config carries ``get_timers()`` where its ``timers`` is None.

    A config that has timers keeps them (a schedule upstream already times is left as it is).
    """

    def get_model_config_with_timers(model: Any) -> Any:
        config = get_model_config(model)
        if getattr(config, "timers", None) is None:
            config.timers = get_timers()
        return config

    return get_model_config_with_timers


def switch_on(schedules: Any, get_timers: Callable[[], Any]) -> None:
    """Replace ``schedules.get_model_config`` by :func:`with_global_timers` of it."""
    schedules.get_model_config = with_global_timers(schedules.get_model_config, get_timers)


def script_argv(args: Sequence[str]) -> list[str]:
    """``[SCRIPT, *ARGS]`` from this module's arguments: the first that is not an option is the
    script; options before it (DeepSpeed's per-node launcher puts ``--local_rank=N`` right after
    the script it starts, which is this module) follow the script, where it reads them.

    Raises :class:`ValueError` when no argument names an existing file.
    """
    for index, arg in enumerate(args):
        if not arg.startswith("-"):
            if not os.path.isfile(arg):
                raise ValueError(f"{arg}: no such file (the training script to run)")
            return [arg, *args[:index], *args[index + 1 :]]
    raise ValueError(f"no training script among {list(args)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -u schedule_timers.py SCRIPT [ARGS...]``: switch the timers on, run the script."""
    try:
        sys.argv = script_argv(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"usage: python -u schedule_timers.py SCRIPT [ARGS...]: {err}", file=sys.stderr)
        return 2
    script = os.path.abspath(sys.argv[0])
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` would have it
    schedules = importlib.import_module(SCHEDULES_MODULE)
    global_vars = importlib.import_module("megatron.global_vars")
    switch_on(schedules, global_vars.get_timers)
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
