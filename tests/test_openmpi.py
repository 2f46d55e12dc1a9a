"""Open MPI: DeepSpeed's openmpi runner in the lab, mpirun over the lab's ssh.

The lab tests need root, iproute2, openssh and openmpi-bin (they skip with the reason
otherwise); the training test also needs ``make setup``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.parse.lines import demux_tagged
from launchers.config.hostfile import load_hostfile
from launchers.config.presets import resolve_spec
from launchers.config.project import (
    RANK_ENV_SCRIPT,
    launcher_command,
    remote_environment,
    script_index,
)
from launchers.config.spec import PLACEHOLDER_PATHS
from launchers.lab.cluster import Lab
from launchers.lab.net import LabError, LinkShape
from launchers.lab.tools import check_launcher

ROOT = Path(__file__).resolve().parents[1]
TWO_NODE = load_hostfile(ROOT / "hostfiles" / "2node")


def test_openmpi_launcher_command() -> None:
    spec = resolve_spec("tiny", "zero1", TWO_NODE, device="cpu", launcher="openmpi",
                        paths=PLACEHOLDER_PATHS)  # fmt: skip
    argv = launcher_command(spec, "/r")
    assert argv[argv.index("--launcher") + 1] == "openmpi"
    assert (
        "--launcher_args=--tag-output" in argv
    )  # [1,0]<stdout>: per line, which the parser strips
    assert "--no_ssh_check" not in argv  # mpirun uses ssh: DeepSpeed's check is meaningful
    assert argv[script_index(argv) - 1] == RANK_ENV_SCRIPT
    assert remote_environment(spec)["MASTER_ADDR"] == "node1"
    assert "--no_ssh_check" in launcher_command(replace(spec, ssh_check=False), "/r")  # the lab


def _skip_reason() -> str | None:
    try:
        check_launcher("openmpi")
    except LabError as err:
        return str(err)
    return None


SKIP = _skip_reason()
needs_openmpi = pytest.mark.skipif(SKIP is not None, reason=f"no Open MPI lab: {SKIP}")

GLOO = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("result", os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], t.item())
# Leave together: a rank that exits while its peer's gloo pair is still open can abort the peer
# ("terminate called without an active exception", signal 6), a race seen once in CI.
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.root
@needs_openmpi
def test_mpirun_over_the_lab_ssh_joins_one_rendezvous(tmp_path: Path) -> None:
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    with Lab(nodes=2, shape=LinkShape.parse("100mbit")) as lab:
        hostfile = lab.write_hostfile(tmp_path / "hostfile")
        extra = {"MASTER_ADDR": lab.master_addr, "MASTER_PORT": "29556"}
        env = lab.openmpi_env(extra)
        exports = [f"{k}={v}" for k, v in lab.node_env(extra).items()]
        argv = ["mpirun", "-n", "2", "-hostfile", str(hostfile), "--tag-output",
                *[a for kv in exports for a in ("-x", kv)],
                sys.executable, "-u", RANK_ENV_SCRIPT, str(script)]  # fmt: skip
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # mpirun tags chunks, not lines (a line's newline may come with a tag of its own)
    lines = demux_tagged(out.stdout.splitlines(keepends=True))
    results = sorted(line.rstrip("\n") for line in lines if "result" in line)
    assert results == ["[1,0]<stdout>:result 0 2 0 3.0", "[1,1]<stdout>:result 1 2 0 3.0"]


# The run through DeepSpeed's openmpi runner on upstream: test_slurm.py
# (test_lab_run_through_the_launcher_asked_for_completes, one case per launcher).
