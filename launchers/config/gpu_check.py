"""``make gpu-check``: one call that runs upstream for real on the GPU at hand and reports it.

On a machine without a CUDA GPU it stops at once (``nvidia-smi`` absent or listing no GPU: no
torch import, well under 5 s) and says so. On a GPU machine, within ``--budget-s`` (9 minutes):

1. ``make setup TORCH=system`` for the check's venv (:func:`setup_command`), the very recipe
   a site's node is set up with: a venv on top of the machine's PyTorch (``python -m venv
   --system-site-packages``, the interpreter that runs this script: the cluster's ``module load
   pytorch`` or container one; a ``.pth`` to its site-packages when that interpreter is itself a
   venv, ``torch_check chain``), the pins but torch and torchvision where missing or at another
   version, the versions found against the tested range, upstream at its pinned commit and the
   tiny dataset. ``--wheels DIR``: ``WHEELS=DIR`` there, so the wheelhouse's manifest is checked
   first (sha256, the target Python, every pin, apex's bundle or tarball), pip sees that folder
   alone at the manifest's versions and none of pip's configuration, and upstream is cloned from
   the wheelhouse's bundle: nothing reaches the network;
2. the versions found (torch, its CUDA, the device, its compute capability, DeepSpeed);
3. only the apex extensions upstream needs, for the device's sm
   (``launchers.config.gpu build-needed``: ``TORCH_CUDA_ARCH_LIST`` from
   ``torch.cuda.get_device_capability``; with ``--wheels``, apex as its manifest names it: a
   bundle or a tarball);
4. ``small`` and ``large`` with the baseline and ZeRO-1/2/3, bf16, world size 1 (ZeRO at DP 1
   is degenerate but runs its code), few iterations, one run at a time in :data:`RUN_ORDER`
   (most telling first), each bounded by what is left; a run that would not fit is not started;
   the small baseline also once more with upstream's PyTorch profiler (:data:`PROFILED`), right
   after the baselines, into ``profiled/``;
5. ``python -m analysis.report`` on the profiled run (compute, communication, memory copy and
   idle per step), then on whatever else ran, with :data:`REPORT_S` kept for it: iteration
   time, TFLOP/s, MFU, tensor memory.

``--dry-run`` prints the plan (every command, in order, the set-up's as ``make -n`` expands
it) and starts nothing; with ``--device cuda`` it does so on a machine without a GPU.

Standard library only: the interpreter that runs it is the machine's, before any project
dependency is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launchers.config.wheelhouse import APEX_BUNDLE_NAME, MANIFEST_NAME

BUDGET_S = 530.0
"""The whole check's budget, seconds: nine minutes with room for the start and the refusal."""

DETECT_TIMEOUT_S = 4.0
"""``nvidia-smi`` gets this long to list the GPUs (the refusal stays under 5 s)."""

MODELS = ("small", "large")
"""Models run."""

STRATEGIES = ("baseline", "zero1", "zero2", "zero3")
"""Strategies run for each model."""

RUN_ORDER = (
    ("large", "baseline"),
    ("small", "baseline"),
    ("large", "zero3"),
    ("large", "zero1"),
    ("large", "zero2"),
    ("small", "zero1"),
    ("small", "zero2"),
    ("small", "zero3"),
)
"""Every (model, strategy) of :data:`MODELS` x :data:`STRATEGIES`, one run each, most telling
first (each model's reference, then the stage that saves most), so that what the budget leaves
out is the least telling."""

TRAIN_ITERS = {"small": 20, "large": 8}
"""Iterations per run: a warm-up window and steady windows of LOG_INTERVAL (as ``make demo``,
few iterations: a run's start-up costs more than its iterations)."""

LOG_INTERVAL = 2
"""Iterations per logged window."""

PROFILED = ("small", "baseline")
"""Run once more after the baselines with upstream's PyTorch profiler over its last logged
window (``--profile``), into its own folder and report: on a GPU the report breaks the profiled
steps into compute kernels, communication, memory copies and idle (docs/profiling.md), which
says where the time goes when MFU is low."""

APEX_NEEDED = ("amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda")
"""The apex extensions upstream imports (``launchers.config.gpu.APEX_EXTENSIONS``, which the
tests compare this with; spelled out here because this module imports nothing of the project)."""

ROOT = Path(__file__).resolve().parents[2]
"""The checkout."""


@dataclass(frozen=True)
class Step:
    """One command of the check."""

    what: str
    """What it does, for the log."""
    argv: list[str]
    """The command."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables added to the environment."""
    skip_if: str = ""
    """When the step is left out at run time (said in the plan)."""
    unset: tuple[str, ...] = ()
    """Variables removed from the environment."""
    needs: Path | None = None
    """Left out when this path does not exist when its turn comes."""


def detect() -> tuple[list[str], str]:
    """(GPU lines of ``nvidia-smi -L``, why none): without a GPU, the reason to stop."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found: no NVIDIA driver on this machine"
    try:
        proc = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=DETECT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi -L did not answer within {DETECT_TIMEOUT_S:g} s"
    except OSError as exc:
        return [], f"nvidia-smi -L: {exc}"
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    if proc.returncode != 0 or not gpus:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return [], f"nvidia-smi -L lists no GPU ({said[-1] if said else f'exit {proc.returncode}'})"
    return gpus, ""


VERSIONS = (
    "import torch, importlib.metadata as m; "
    "cap = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None; "
    'print("torch", torch.__version__, "cuda", torch.version.cuda, "device", '
    'torch.cuda.get_device_name(0) if cap else None, "sm", '
    '"%d.%d" % cap if cap else None, "deepspeed", m.version("deepspeed"))'
)
"""What the versions step prints."""


MAKE_STATE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
"""What the ``make gpu-check`` around this script passes down to a make it starts (its
command-line variables, ``DEVICE=cuda`` among them): the set-up's make runs without them."""


def setup_command(venv: Path, base_python: str, wheels: Path | None) -> list[str]:
    """``make setup TORCH=system`` into ``venv`` on ``base_python``'s PyTorch: the set-up a node
    gets, one recipe for both. ``wheels``: ``WHEELS=`` that folder, with its apex bundle required
    (``APEX_CHECK=--apex``, as ``DEVICE=cuda`` would: the apex step clones from it); apex itself
    is left to the apex step (``DEVICE=`` empty), which builds only what upstream needs."""
    cmd = [
        "make",
        "--no-print-directory",
        "setup",
        "TORCH=system",
        f"VENV={venv}",
        f"PYTHON={venv / 'bin' / 'python'}",
        f"SYSTEM_PYTHON={base_python}",
        "DEVICE=",
        "ALLOW_NO_UPSTREAM=",
        f"WHEELS={wheels or ''}",
    ]
    return [*cmd, "APEX_CHECK=--apex"] if wheels else cmd


def apex_file(wheels: Path) -> Path:
    """The wheelhouse's apex, as its manifest names it: a bundle of its history or a source
    tarball of the pinned tree (the set-up's manifest check says what is wrong with either)."""
    try:
        return wheels / json.loads((wheels / MANIFEST_NAME).read_text())["apex"]["file"]
    except (OSError, ValueError, KeyError, TypeError):
        return wheels / APEX_BUNDLE_NAME


def plan(
    venv: Path, logs: Path, base_python: str, wheels: Path | None, resume: bool = False
) -> list[Step]:
    """Every command of the check, in order. ``resume``: a run that completed under ``logs`` in
    an earlier call is not run again (the matrix skips a completed identical run unless
    forced), so a second call on the same machine goes on where the first one's time ran out."""
    py = str(venv / "bin" / "python")
    hostfile = logs / "hostfile"
    steps = [
        Step(
            "make setup TORCH=system: the venv on the machine's PyTorch, the pins but "
            "torch/torchvision, upstream"
            + (f"; from the wheelhouse {wheels}, checked first, no network" if wheels else ""),
            setup_command(venv, base_python, wheels),
            unset=MAKE_STATE,
        ),
        Step("versions found", [py, "-c", VERSIONS]),
        Step(
            f"apex: only {', '.join(APEX_NEEDED)}, for this GPU's sm"
            + (f" (from {apex_file(wheels)})" if wheels else ""),
            [py, "-m", "launchers.config.gpu", "build-needed"],
            env={"APEX_REPO": str(apex_file(wheels))} if wheels else {},
            skip_if="every one imports already",
        ),
    ]
    order = [(m, s, False) for m, s in RUN_ORDER]
    order.insert(order.index((*PROFILED, False)) + 1, (*PROFILED, True))
    for model, strategy, profiled in order:
        steps.append(
            Step(
                f"{model} {strategy} in bf16 at world size 1"
                + (", profiled (PyTorch profiler over the last window)" if profiled else ""),
                [
                    py,
                    "-m",
                    "launchers",
                    "matrix",
                    "--model",
                    model,
                    "--strategies",
                    strategy,
                    "--device",
                    "cuda",
                    "--hosts",
                    str(hostfile),
                    "--logs",
                    str(logs / ("profiled" if profiled else "runs")),
                    "--set",
                    "precision=bf16",
                    "--set",
                    f"train_iters={TRAIN_ITERS[model]}",
                    "--set",
                    f"log_interval={LOG_INTERVAL}",
                    "--skip-doctor",
                    *(["--profile"] if profiled else []),
                    *([] if resume else ["--force"]),
                ],
            )
        )
    steps.append(
        Step(
            "the profiled run's report: compute, communication, memory copy and idle per step",
            [
                py,
                "-m",
                "analysis.report",
                str(logs / "profiled"),
                "--out",
                str(logs / "profiled-report"),
            ],
            skip_if="the profiled run did not start",
            needs=logs / "profiled",
        )
    )
    steps.append(
        Step(
            "the report: iteration time, TFLOP/s, MFU, tensor memory",
            [
                py,
                "-m",
                "analysis.report",
                str(logs / "runs"),
                "--out",
                str(logs / "report"),
                "--summary",
            ],
        )
    )
    return steps


REPORT_S = 30.0
"""Kept back from the runs for the report."""


RUN_CAP_S = 150.0
"""Longest a run after the first may take: the first also compiles upstream's fused kernels
(rank 0, cached for the others) and gets whatever is left."""

MIN_RUN_S = 40.0
"""A run is not started with less than this left before the report's reserve: it would not
reach a steady window."""


def with_timeout(step: Step, left_s: float, first_run: bool) -> list[str]:
    """The step's argv; a run gets ``--timeout``: what is left of the budget less the report's
    reserve, at most :data:`RUN_CAP_S` unless it is the first run."""
    if "matrix" not in step.argv:
        return step.argv
    bound = left_s - REPORT_S if first_run else min(left_s - REPORT_S, RUN_CAP_S)
    return [*step.argv, "--timeout", str(max(int(MIN_RUN_S), int(bound)))]


def environment(step: Step) -> dict[str, str]:
    """The environment a step runs in: this one, less :attr:`Step.unset`, plus :attr:`Step.env`."""
    env = {k: v for k, v in os.environ.items() if k not in step.unset}
    return {**env, **step.env}


def expanded(step: Step) -> list[str]:
    """The commands ``make -n`` says a make step runs (as the set-up stands now: a venv whose
    pins are up to date runs fewer); the reason when make cannot say."""
    if step.argv[:1] != ["make"]:
        return []
    cmd = [step.argv[0], "-n", *step.argv[1:]]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=environment(step), capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"(make -n could not list them: {exc})"]
    if proc.returncode != 0:
        return [f"(make -n could not list them, exit {proc.returncode}: {proc.stderr.strip()})"]
    return proc.stdout.splitlines()


def show_plan(steps: list[Step], logs: Path, budget_s: float, gpus: list[str]) -> None:
    """Print every command of the check, in order, the set-up's as ``make -n`` expands it."""
    print(f"gpu-check plan (budget {budget_s:g} s; {', '.join(gpus) or 'GPU assumed'}):")
    print(f"  write {logs / 'hostfile'}: localhost slots=1")
    for n, step in enumerate(steps, 1):
        env = " ".join(f"{k}={v}" for k, v in step.env.items())
        unset = "".join(f"-u {k} " for k in step.unset)
        skip = f"  (skipped when {step.skip_if})" if step.skip_if else ""
        prefix = f"env {unset}" if unset else ""
        print(f"  {n}. {step.what}{skip}\n     {prefix}{env + ' ' if env else ''}"
              f"{shlex.join(with_timeout(step, budget_s, True))}")  # fmt: skip
        for line in expanded(step):
            print(f"       | {line}")


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every step ran, 2 without a GPU, 1 when a step failed."""
    ap = argparse.ArgumentParser(prog="python -m launchers.config.gpu_check", description=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    ap.add_argument("--device", choices=("cuda",), help="cuda: plan as on a GPU machine")
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-gpu")
    ap.add_argument("--logs", type=Path, default=ROOT / "logs" / "gpu-check")
    ap.add_argument("--wheels", type=Path, help="set up from this wheelhouse, no network")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S)
    ap.add_argument(
        "--resume", action="store_true", help="skip the runs that completed in an earlier call"
    )
    args = ap.parse_args(argv)
    start = time.monotonic()
    gpus, why = ([], "") if args.dry_run and args.device == "cuda" else detect()
    if not gpus and not (args.dry_run and args.device == "cuda"):
        print(f"gpu-check: no CUDA GPU on this machine: {why}; nothing was run "
              "(DRY_RUN=1 DEVICE=cuda prints the plan)", file=sys.stderr)  # fmt: skip
        return 2
    logs, venv = args.logs.absolute(), args.venv.absolute()
    wheels = args.wheels.absolute() if args.wheels else None
    steps = plan(venv, logs, sys.executable, wheels, args.resume)
    if args.dry_run:
        show_plan(steps, logs, args.budget_s, gpus)
        return 0
    print(f"gpu-check: {'; '.join(gpus)}", flush=True)
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "hostfile").write_text("localhost slots=1\n")
    return execute(steps, args.budget_s, start, logs)


def execute(steps: list[Step], budget_s: float, start: float, logs: Path) -> int:
    """Run ``steps`` in order within ``budget_s`` of ``start``: a set-up step that fails stops the
    check; a run or a report that fails, or a run not started for want of time, leaves the others
    to go on; the report (the last step) runs whatever the runs did, with :data:`REPORT_S` kept
    for it.
    Exit 0 when every step ran and succeeded, 1 otherwise."""
    first_run, failed, left_out = True, [], []
    for step in steps:
        left = budget_s - (time.monotonic() - start)
        report = "analysis.report" in step.argv
        run = "matrix" in step.argv
        if step.needs is not None and not step.needs.exists():
            print(f"gpu-check: '{step.what}' left out: no {step.needs}", flush=True)
            continue
        if run and left - REPORT_S < MIN_RUN_S:
            left_out.append(step.what)
            print(f"gpu-check: out of time for '{step.what}' ({left:.0f} s left, "
                  f"{REPORT_S:g} s kept for the report): not run", flush=True)  # fmt: skip
            continue
        if left <= 0 or (not report and left < REPORT_S):
            print(f"gpu-check: out of time before '{step.what}'", file=sys.stderr)
            return 1
        cmd = with_timeout(step, left, first_run)
        first_run = first_run and not run
        print(f"gpu-check: {step.what}: {shlex.join(cmd)}", flush=True)
        limit = left if report else left - REPORT_S
        began = time.monotonic()
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=environment(step), timeout=limit, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            print(f"gpu-check: '{step.what}' ran past the budget and was stopped", file=sys.stderr)
        print(f"gpu-check: '{step.what}' took {time.monotonic() - began:.0f} s, "
              f"{time.monotonic() - start:.0f} s of the budget used", flush=True)  # fmt: skip
        if rc != 0 and not run and not report:  # (a set-up step: nothing after it can run)
            print(f"gpu-check: '{step.what}' failed (exit {rc})", file=sys.stderr)
            return 1
        if rc != 0 and report:  # (a report that fails leaves the others to run)
            failed.append(step.what)
            print(f"gpu-check: '{step.what}' failed (exit {rc})", file=sys.stderr)
        elif rc != 0:
            failed.append(step.what)
            print(f"gpu-check: '{step.what}' did not complete (exit {rc}); the report says "
                  "what it logged", flush=True)  # fmt: skip
    took = time.monotonic() - start
    print(f"gpu-check: done in {took:.0f} s; {logs / 'report' / 'report.md'}"
          + (f"; did not complete: {', '.join(failed)}" if failed else "")
          + (f"; not run for want of time: {', '.join(left_out)}" if left_out else ""))  # fmt: skip
    return 1 if failed or left_out else 0


if __name__ == "__main__":
    raise SystemExit(main())
