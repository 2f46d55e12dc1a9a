"""The schedule's compute timers: ``--timers all`` starts the ranks through
``launchers/run/schedule_timers.py``, which hands the config upstream's schedule reads from the
model Megatron's global timers and runs the training script as ``python SCRIPT ARGS`` would; the
spec records it only when on, so other specs keep their hash."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import tiny_specs

from launchers.config.project import SCHEDULE_TIMERS_SCRIPT, launcher_command, script_index
from launchers.config.spec import SpecError, spec_from_json, spec_hash, spec_to_json
from launchers.run import schedule_timers


def test_script_argv_puts_the_launchers_local_rank_after_the_script(tmp_path: Path) -> None:
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    args = ["--local_rank=3", str(script), "--num-layers", "4"]
    assert schedule_timers.script_argv(args) == [str(script), "--local_rank=3", "--num-layers", "4"]
    with pytest.raises(ValueError, match="no such file"):
        schedule_timers.script_argv([str(tmp_path / "missing.py")])
    with pytest.raises(ValueError, match="no training script"):
        schedule_timers.script_argv(["--local_rank=0"])


def test_the_models_config_gets_the_global_timers_only_where_it_has_none() -> None:
    none, own = SimpleNamespace(timers=None), SimpleNamespace(timers="its own")
    timers = object()
    get = schedule_timers.with_global_timers(lambda model: model, lambda: timers)
    assert get(none).timers is timers
    assert get(own).timers == "its own"


def test_the_script_runs_as_main_with_the_schedules_config_timed(tmp_path: Path) -> None:
    """A stand-in upstream (a ``megatron`` package beside the script, as upstream's is) whose
    schedule module's config has no timers: the script, run through the wrapper, sees the global
    timers on it, its own directory first on ``sys.path`` and its arguments as given."""
    pkg = tmp_path / "megatron" / "core" / "pipeline_parallel"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "megatron", tmp_path / "megatron" / "core", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "schedules.py").write_text(
        "from types import SimpleNamespace\n"
        "CONFIG = SimpleNamespace(timers=None)\n"
        "def get_model_config(model):\n    return CONFIG\n"
    )
    (tmp_path / "megatron" / "global_vars.py").write_text("def get_timers():\n    return 'T'\n")
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(
        textwrap.dedent("""\
        import json, sys
        from megatron.core.pipeline_parallel import schedules
        if __name__ == "__main__":
            print(json.dumps({"timers": schedules.get_model_config(None).timers,
                              "argv": sys.argv, "path0": sys.path[0]}))
        """)
    )
    out = subprocess.run(
        [sys.executable, "-u", SCHEDULE_TIMERS_SCRIPT, "--local_rank=1", str(script), "--a", "b c"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got == {
        "timers": "T",
        "argv": [str(script), "--local_rank=1", "--a", "b c"],
        "path0": str(tmp_path),
    }
    bad = subprocess.run([sys.executable, SCHEDULE_TIMERS_SCRIPT, "--local_rank=1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "no training script" in bad.stderr


def test_the_spec_records_schedule_timers_only_when_on() -> None:
    (spec,) = tiny_specs(["baseline"])
    doc = spec_to_json(spec)
    assert "schedule_timers" not in doc
    on = replace(spec, timing_log_option="all", schedule_timers=True)
    assert spec_to_json(on)["schedule_timers"] is True
    assert spec_from_json(spec_to_json(on)) == on
    assert spec_hash(on) != spec_hash(replace(spec, timing_log_option="all"))
    with pytest.raises(SpecError, match="schedule_timers must be true or false"):
        replace(spec, schedule_timers="yes")  # type: ignore[arg-type]


def test_the_launcher_starts_the_script_through_the_wrapper_only_when_on() -> None:
    (spec,) = tiny_specs(["baseline"])
    argv = launcher_command(spec, "/runs/r")
    assert SCHEDULE_TIMERS_SCRIPT not in argv
    on = launcher_command(replace(spec, schedule_timers=True), "/runs/r")
    index = script_index(on)
    assert on[index - 1] == SCHEDULE_TIMERS_SCRIPT
    assert on[index + 1 :] == argv[script_index(argv) + 1 :]


UPSTREAM = Path.home() / ".cache" / "megatron-deepspeed-bench" / "Megatron-DeepSpeed"


@pytest.mark.skipif(not UPSTREAM.is_dir(), reason=f"upstream not checked out at {UPSTREAM}")
def test_upstreams_schedule_times_compute_through_the_models_config() -> None:
    """What the wrapper relies on: upstream's schedule calls its module-level
    ``get_model_config`` and starts ``forward-compute``/``backward-compute`` on that config's
    ``timers`` (an upstream that changes this needs the wrapper looked at again)."""
    path = UPSTREAM / "megatron" / "core" / "pipeline_parallel" / "schedules.py"
    text = path.read_text()
    tree = ast.parse(text)
    imported = {
        a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
    }
    assert "get_model_config" in imported
    for timer in ("forward-compute", "backward-compute"):
        assert f"config.timers('{timer}', log_level=2).start()" in text
