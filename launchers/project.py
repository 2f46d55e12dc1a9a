"""Pure projections of a RunSpec: Megatron argv, DeepSpeed JSON, environment, launcher command.

Nothing here touches the file system or the shell: argv are ``list[str]`` built by
:func:`to_flag`; shell text is produced only by ``launchers.render`` through ``shlex``.
Sources for every flag: UPSTREAM.md and upstream's ``megatron/arguments.py`` (pinned commit).
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, Literal

from launchers.gpu import gradient_accumulation_fusion
from launchers.spec import RunSpec

NODE_RANK = "${NODE_RANK}"
"""Symbolic ``--node_rank`` value of ``no_ssh`` commands; each node substitutes its own rank
(``launch.sh`` takes it as ``$1`` or from the environment)."""

DS_CONFIG_NAME = "ds_config.json"
"""File name of the DeepSpeed config inside a run directory."""
HOSTFILE_NAME = "hostfile"
"""File name of the hostfile copy inside a run directory."""
DS_ENV_NAME = "deepspeed_env"
"""DeepSpeed's environment file (``DS_ENV_FILE``): multi-node runners export only a few variable
families to remote ranks (``launcher/runner.py`` ``EXPORT_ENVS``), plus what this file lists."""

LR_DECAY_STYLE = "cosine"
"""Learning-rate schedule of the lab runs (``lab-logs/*.cmd``)."""
SPLIT = "98,1,1"
"""Train/valid/test split of the lab runs; validation is off anyway (eval_iters 0)."""
TOKENIZER = "GPT2BPETokenizer"
"""Upstream tokenizer for GPT-2-format ``vocab.json``/``merges.txt``."""
NUM_WORKERS = 0
"""Data-loader worker processes (lab runs: 0; the indexed dataset is memory-mapped)."""
TIMING_LOG_LEVEL = 2
"""Megatron timers needed by the analysis (0 prints none)."""
FP16_INITIAL_SCALE_POWER = 16
"""Dynamic loss scaling starts at 2**16 (DeepSpeed's default)."""
FP16_LOSS_SCALE_WINDOW = 1000
"""Steps without overflow before the loss scale grows (DeepSpeed's default)."""

RANK_ENV_LAUNCHERS = ("openmpi", "slurm")
"""Launchers whose DeepSpeed runner starts ``python <script>`` per rank through ``mpirun`` or
``srun`` without DeepSpeed's per-node launcher: nothing sets ``RANK``/``WORLD_SIZE``, which
upstream reads while parsing its arguments, so the script they start is
:data:`RANK_ENV_SCRIPT`, which sets them and then runs ``pretrain_gpt.py``."""

RANK_ENV_SCRIPT = str(Path(__file__).resolve().with_name("rank_env.py"))
"""``launchers/rank_env.py`` of this checkout (the same path on every node, like the venv)."""

LAUNCHER_ARGS: dict[str, str] = {"slurm": "--label", "openmpi": "--tag-output"}
"""Options DeepSpeed passes to ``srun``/``mpirun`` (``--launcher_args``): every output line
prefixed with its rank (``0: `` from srun, ``[1,0]<stdout>:`` from mpirun), so the parser keeps
the ranks' lines apart in the one log that carries them all."""


def to_flag(key: str, value: Any, sep: Literal["-", "_"] = "-") -> list[str]:
    """One command-line option: ``to_flag("num_layers", 4) == ["--num-layers", "4"]``.

    ``True`` gives the bare switch, ``False``/``None`` nothing; ``sep="_"`` keeps underscores
    (DeepSpeed's own options: ``--deepspeed_config``, ``--node_rank``).
    """
    flag = "--" + (key.replace("_", "-") if sep == "-" else key)
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    return [flag, str(value)]


def megatron_args(spec: RunSpec, run_dir: str) -> list[str]:
    """Arguments of upstream ``pretrain_gpt.py`` (after the script path)."""
    m, s, t, p = spec.model, spec.strategy, spec.training, spec.paths
    cpu = spec.device == "cpu"
    pairs: list[tuple[str, Any]] = [
        ("tensor_model_parallel_size", s.tp),
        ("pipeline_model_parallel_size", s.pp),
        # PP=1 runs the plain engine; without this flag DeepSpeed would build GPTModelPipe.
        ("no_pipeline_parallel", s.pp == 1),
        ("num_layers", m.num_layers),
        ("hidden_size", m.hidden_size),
        ("num_attention_heads", m.num_attention_heads),
        ("seq_length", m.seq_length),
        ("max_position_embeddings", m.max_position_embeddings),
        ("micro_batch_size", m.micro_batch_size),
        ("global_batch_size", m.global_batch_size),
        ("train_iters", t.train_iters),
        ("lr", t.lr),
        ("min_lr", t.min_lr),
        ("lr_decay_style", LR_DECAY_STYLE),
        ("lr_warmup_iters", t.lr_warmup_iters),
        ("weight_decay", t.weight_decay),
        ("clip_grad", t.clip_grad),
        ("data_path", p.data_path),
        ("vocab_file", p.vocab_file),
        ("merge_file", p.merge_file),
        ("tokenizer_type", TOKENIZER),
        ("split", SPLIT),
        # Benchmarks: no evaluation; the interval lies beyond the last iteration.
        ("eval_iters", 0),
        ("eval_interval", t.train_iters + 1),
        ("num_workers", NUM_WORKERS),
        ("log_interval", t.log_interval),
        ("timing_log_level", TIMING_LOG_LEVEL),
        ("timing_log_option", "minmax"),
        ("deepspeed", True),
        ("zero_stage", s.zero_stage),
        ("seed", t.seed),
        ("fp16", m.precision == "fp16"),
        ("bf16", m.precision == "bf16"),
        # Full recompute; with DeepSpeed's checkpointing (as upstream's examples_deepspeed do)
        # so that GPTModelPipe's activation_checkpoint_interval takes effect too.
        ("checkpoint_activations", t.activation_checkpointing),
        ("deepspeed_activation_checkpointing", t.activation_checkpointing),
        # ZeRO-Offload needs DeepSpeedCPUAdam (DeepSpeed refuses a client GPU optimizer).
        ("cpu_optimizer", s.offload != "none"),
        # CPU: the fused kernel is CUDA-only ("fused_weight_gradient_mlp_cuda module is not found");
        # on CUDA it is apex's extension: off when the resolver found it missing (an adjustment).
        ("no_gradient_accumulation_fusion", not gradient_accumulation_fusion(spec)),
        # CPU with PP: torch LayerNorm rejects sequence_parallel=; RMSNorm works.
        ("normalization", "rmsnorm" if cpu and s.pp > 1 else None),
    ]
    argv: list[str] = []
    for key, value in pairs:
        argv += to_flag(key, value)
        if key == "deepspeed":
            argv += to_flag("deepspeed_config", ds_config_path(run_dir), sep="_")
    return argv


def ds_config_path(run_dir: str) -> str:
    """Path of the DeepSpeed config in a run directory."""
    return posixpath.join(run_dir, DS_CONFIG_NAME)


def ds_config(spec: RunSpec) -> dict[str, Any]:
    """The DeepSpeed JSON config."""
    m, s = spec.model, spec.strategy
    zero: dict[str, Any] = {"stage": s.zero_stage}
    pin = spec.device == "cuda"  # pinned host memory speeds GPU<->CPU copies; no GPU, no pinning
    if s.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if s.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    fp16: dict[str, Any] = {"enabled": m.precision == "fp16"}
    if m.precision == "fp16":
        fp16 |= {
            "loss_scale": 0,  # 0 = dynamic loss scaling
            "initial_scale_power": FP16_INITIAL_SCALE_POWER,
            "loss_scale_window": FP16_LOSS_SCALE_WINDOW,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    return {
        "train_batch_size": m.global_batch_size,
        "train_micro_batch_size_per_gpu": m.micro_batch_size,
        "gradient_accumulation_steps": spec.gradient_accumulation_steps,
        # DeepSpeed prints (and the PipelineEngine sums its timers) every steps_per_print steps.
        "steps_per_print": spec.training.log_interval,
        "gradient_clipping": spec.training.clip_grad,
        "zero_optimization": zero,
        "fp16": fp16,
        "bf16": {"enabled": m.precision == "bf16"},
        # PipelineEngine asserts "bwd_microstep timer has already been started" with it on.
        "wall_clock_breakdown": s.pp == 1,
    }


def environment(spec: RunSpec, run_dir: str) -> dict[str, str]:
    """Variables ``launch.sh`` exports before starting the launcher."""
    env: dict[str, str] = {}
    if spec.device == "cpu":
        env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if needs_env_file(spec):
        env["DS_ENV_FILE"] = posixpath.join(run_dir, DS_ENV_NAME)
    return env


def remote_environment(spec: RunSpec) -> dict[str, str]:
    """Variables that must reach the ranks on other hosts (written to ``deepspeed_env``).

    With ``openmpi`` and ``slurm`` the rendezvous address too: their runners pass
    ``--master_addr`` to no one, and ``rank_env.py`` reads it from the environment.
    """
    env: dict[str, str] = {}
    if spec.device == "cpu":
        env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if spec.launcher in RANK_ENV_LAUNCHERS:
        env |= {"MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port)}
    return env


def needs_env_file(spec: RunSpec) -> bool:
    """Multi-node runners (pdsh, openmpi, slurm) forward only listed variables to remote ranks."""
    return spec.launcher in ("pdsh", "openmpi", "slurm") and bool(remote_environment(spec))


def launcher_command(spec: RunSpec, run_dir: str, node_rank: int | str = NODE_RANK) -> list[str]:
    """The full ``deepspeed ... pretrain_gpt.py ...`` argv.

    ``no_ssh`` commands carry ``node_rank`` (by default the symbolic :data:`NODE_RANK`).
    """
    argv = [spec.paths.deepspeed]
    if spec.launcher == "local":
        # No --hostfile: given one, the runner first checks ssh to its host even when it is the
        # only one ("host=localhost was not reachable via ssh"); --num_gpus is how the lab runs
        # started their ranks (also on CPU).
        argv += to_flag("num_gpus", spec.cluster.hosts[0].slots, sep="_")
    else:
        argv += to_flag("hostfile", posixpath.join(run_dir, HOSTFILE_NAME), sep="_")
    if spec.launcher in ("pdsh", "openmpi", "slurm"):
        argv += to_flag("launcher", spec.launcher, sep="_")
    if spec.launcher in LAUNCHER_ARGS:  # one token: argparse would read "--label" as an option
        argv.append(f"--launcher_args={LAUNCHER_ARGS[spec.launcher]}")
    # The runner's check is a bare `ssh HOST hostname`: meaningless for slurm (srun reaches
    # the nodes through slurmd), and off where ssh needs options it does not pass (the lab).
    if spec.launcher == "slurm" or (spec.launcher in ("pdsh", "openmpi") and not spec.ssh_check):
        argv += to_flag("no_ssh_check", True, sep="_")
    if spec.launcher == "no_ssh":
        argv += to_flag("no_ssh", True, sep="_") + to_flag("node_rank", node_rank, sep="_")
    if spec.launcher != "local":  # local: DeepSpeed uses 127.0.0.1
        argv += to_flag("master_addr", spec.master_addr, sep="_")
    argv += to_flag("master_port", spec.master_port, sep="_")
    if spec.launcher in RANK_ENV_LAUNCHERS:
        argv.append(RANK_ENV_SCRIPT)
    argv.append(posixpath.join(spec.paths.upstream_dir, "pretrain_gpt.py"))
    return argv + megatron_args(spec, run_dir)


def script_index(argv: list[str]) -> int:
    """Index of ``pretrain_gpt.py`` in a launcher argv: what follows are Megatron's arguments."""
    for index, arg in enumerate(argv):
        if arg.endswith("/pretrain_gpt.py") or arg == "pretrain_gpt.py":
            return index
    raise ValueError("pretrain_gpt.py not in the command")
