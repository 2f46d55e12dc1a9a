"""Pure projections of a RunSpec: Megatron argv, DeepSpeed JSON, environment, launcher command.

Nothing here touches the file system or the shell: argv are ``list[str]`` built by
:func:`to_flag`; shell text is produced only by ``launchers.run.render`` through ``shlex``.
Sources for every flag: UPSTREAM.md and upstream's ``megatron/arguments.py`` (pinned commit).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from launchers.config.gpu import gradient_accumulation_fusion
from launchers.config.softmax_fusion import masked_softmax_fusion
from launchers.config.spec import RunSpec
from launchers.config.upstream import torch_extensions_dir

NODE_RANK = "${NODE_RANK}"
"""Symbolic ``--node_rank`` value of ``no_ssh`` commands; each node substitutes its own rank
(``launch.sh`` takes it as ``$1`` or from the environment)."""

DS_CONFIG_NAME = "ds_config.json"
#: Folder of a run directory where upstream's TensorBoard writer (last rank) puts its event files.
TENSORBOARD_DIR_NAME = "tensorboard"
"""File name of the DeepSpeed config inside a run directory."""
HOSTFILE_NAME = "hostfile"
"""File name of the hostfile copy inside a run directory."""
DS_ENV_NAME = "deepspeed_env"
"""DeepSpeed's environment file (``DS_ENV_FILE``): multi-node runners export only a few variable
families to remote ranks (``launcher/runner.py`` ``EXPORT_ENVS``), plus what this file lists."""

REMOTE_LAUNCHERS = ("pdsh", "openmpi", "slurm")
"""Launchers whose runner starts the ranks of other hosts itself (ssh, mpirun, srun)."""
DS_EXPORT_PREFIXES = ("MLFLOW", "PYTHON", "MV2", "UCX")
"""Variable families DeepSpeed's runner copies from its environment to remote ranks
(``launcher/runner.py`` ``EXPORT_ENVS``); the CUDA accelerator adds ``NCCL``."""
DS_UNQUOTED = re.compile(r"[\w@%+=:,./-]*")
"""Values DeepSpeed's runner exports unquoted (``MultiNodeRunner.add_export``); any other value
it wraps in double quotes, which the remote shell then expands."""
SHELL_LITERAL = re.compile(r"[\w@+=:,./-]*")
"""Words a POSIX shell and pdsh take literally without quoting: ``DS_UNQUOTED`` less ``%``,
which pdsh substitutes (``%h`` host, ``%u`` user, ``%n`` rank) anywhere in the remote command."""

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

RANK_ENV_SCRIPT = str(Path(__file__).resolve().parents[1] / "run" / "rank_env.py")
"""``launchers/run/rank_env.py`` of this checkout (the same path on every node, like the venv)."""

SCHEDULE_TIMERS_SCRIPT = str(Path(__file__).resolve().parents[1] / "run" / "schedule_timers.py")
"""``launchers/run/schedule_timers.py`` of this checkout: with the spec's ``schedule_timers`` the
ranks start it, and it runs ``pretrain_gpt.py`` with the schedule's compute timers on."""

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
    cpu_recompute = t.activation_checkpointing and spec.device == "cpu"
    pairs: list[tuple[str, Any]] = [
        ("tensor_model_parallel_size", s.tp),
        ("pipeline_model_parallel_size", s.pp),
        # PP=1 runs the plain engine; without this flag DeepSpeed would build GPTModelPipe.
        ("no_pipeline_parallel", s.pp == 1),
        ("num_layers", m.num_layers),
        ("hidden_size", m.hidden_size),
        ("ffn_hidden_size", m.ffn_hidden_size),  # None (Megatron's 4h): no flag
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
        # Megatron pads the tokenizer's vocabulary to a multiple of this x TP: the model gets
        # exactly the spec's padded vocabulary (GPT-2's 50,304 rows for small and large, also
        # with the offline dataset's few hundred tokens).
        ("make_vocab_size_divisible_by", spec.padded_vocab_size // s.tp),
        ("split", SPLIT),
        # Benchmarks: no evaluation; the interval lies beyond the last iteration.
        ("eval_iters", 0),
        ("eval_interval", t.train_iters + 1),
        ("num_workers", NUM_WORKERS),
        ("log_interval", t.log_interval),
        ("timing_log_level", TIMING_LOG_LEVEL),
        ("timing_log_option", spec.timing_log_option),
        ("deepspeed", True),
        ("zero_stage", s.zero_stage),
        ("seed", t.seed),
        ("fp16", m.precision == "fp16"),
        ("bf16", m.precision == "bf16"),
        # Full recompute; with DeepSpeed's checkpointing (as upstream's examples_deepspeed do)
        # so that GPTModelPipe's activation_checkpoint_interval takes effect too. Not on CPU:
        # DeepSpeed's CheckpointFunction asks the accelerator for a Stream, which the CPU
        # accelerator has not ("'NoneType' object is not callable" at the first forward).
        # There Megatron's own CheckpointFunction recomputes every layer: ParallelTransformer.
        # _checkpointed_forward needs a recompute method then ("Invalid activation recompute
        # method"); uniform with --recompute-num-layers 1 (its default) is one layer a unit.
        ("checkpoint_activations", t.activation_checkpointing),
        ("deepspeed_activation_checkpointing", t.activation_checkpointing and not cpu_recompute),
        ("recompute_granularity", "full" if cpu_recompute else None),
        ("recompute_method", "uniform" if cpu_recompute else None),
        # ZeRO-Offload needs DeepSpeedCPUAdam (DeepSpeed refuses a client GPU optimizer).
        ("cpu_optimizer", s.offload != "none"),
        # CPU: the fused kernel is CUDA-only ("fused_weight_gradient_mlp_cuda module is not found");
        # on CUDA it is apex's extension: off when the resolver found it missing (an adjustment).
        ("no_gradient_accumulation_fusion", not gradient_accumulation_fusion(spec)),
        # Upstream's fused softmax kernels pass compute_70, which CUDA 13's nvcc rejects: off
        # there, or as --set masked_softmax_fusion says (an adjustment, softmax_fusion.py).
        ("no_masked_softmax_fusion", not masked_softmax_fusion(spec)),
        # CPU with PP: torch LayerNorm rejects sequence_parallel=; RMSNorm works.
        ("normalization", "rmsnorm" if spec.normalization == "rmsnorm" else None),
        # TensorBoard (the last rank writes): loss, learning rate and batch size every iteration,
        # the timers (max over ranks, s per iteration so far in the log interval, so at each
        # logged iteration the text log's max / 1000) and the iteration time at each logged one.
        ("tensorboard_dir", tensorboard_dir(run_dir)),
        ("log_timers_to_tensorboard", True),
        ("log_batch_size_to_tensorboard", True),
        ("log_world_size_to_tensorboard", True),
        ("log_validation_ppl_to_tensorboard", True),
        # CUDA only: upstream reads torch.cuda.memory_stats(), empty on CPU (KeyError).
        ("log_memory_to_tensorboard", spec.device == "cuda"),
    ]
    argv: list[str] = []
    for key, value in pairs:
        argv += to_flag(key, value)
        if key == "deepspeed":
            argv += to_flag("deepspeed_config", ds_config_path(run_dir), sep="_")
    if spec.profile_steps:
        # Upstream's megatron/profiler.py: torch.profiler on every rank (CPU activities, CUDA's
        # too on cuda) over these iterations, one gzipped Chrome trace per rank written by
        # tensorboard_trace_handler into --tensorboard-dir. Its option is spelt with "_".
        first, last = spec.profile_steps
        argv += to_flag("profile", "pt") + to_flag("profile_steps", f"{first},{last}", sep="_")
    return argv


def tensorboard_dir(run_dir: str) -> str:
    """Folder of upstream's TensorBoard event files in a run directory."""
    return posixpath.join(run_dir, TENSORBOARD_DIR_NAME)


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


def venv_bin(spec: RunSpec) -> str:
    """The ``bin`` directory of the environment that runs the job (holds ``python3``)."""
    return posixpath.dirname(spec.paths.python)


def environment(spec: RunSpec, run_dir: str) -> dict[str, str]:
    """Variables ``launch.sh`` exports before starting the launcher (``PATH`` apart: it puts
    :func:`venv_bin` in front of the node's own, see ``launchers.run.render``)."""
    env: dict[str, str] = {}
    if spec.device == "cpu":
        env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if ext := torch_extensions_dir(spec.paths.python):
        env["TORCH_EXTENSIONS_DIR"] = ext
    if needs_env_file(spec):
        env["DS_ENV_FILE"] = posixpath.join(run_dir, DS_ENV_NAME)
    return env


def remote_environment(spec: RunSpec, path: str | None = None) -> dict[str, str]:
    """Variables that must reach the ranks on other hosts (written to ``deepspeed_env``).

    ``PATH`` is :func:`venv_bin` followed by ``path`` (default: this process's ``PATH``): the
    ranks and what upstream runs from them (its Makefile's ``python3 -m pybind11``) must find
    the venv's interpreter first on every node, and DeepSpeed's runners do not forward ``PATH``.
    With ``openmpi`` and ``slurm`` the rendezvous address too: their runners pass
    ``--master_addr`` to no one, and ``rank_env.py`` reads it from the environment.
    """
    env: dict[str, str] = {}
    if spec.device == "cpu":
        env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if spec.launcher in RANK_ENV_LAUNCHERS:
        env |= {"MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port)}
    if ext := torch_extensions_dir(spec.paths.python):  # the venv's own JIT ops on every node
        env["TORCH_EXTENSIONS_DIR"] = ext
    tail = os.environ.get("PATH", "") if path is None else path
    env["PATH"] = os.pathsep.join(p for p in (venv_bin(spec), tail) if p)
    return env


def needs_env_file(spec: RunSpec) -> bool:
    """Multi-node runners (pdsh, openmpi, slurm) forward only listed variables to remote ranks."""
    return spec.launcher in REMOTE_LAUNCHERS


def through_pdsh(spec: RunSpec) -> bool:
    """DeepSpeed's pdsh runner joins the command into one remote shell line: with pdsh and more
    than one host (with one host the runner starts the ranks itself, as argv)."""
    return spec.launcher == "pdsh" and len(spec.cluster.hosts) > 1


def pdsh_word(value: str) -> str:
    """``value`` as DeepSpeed's pdsh runner must receive an argument for the remote shell to see
    it literally.

    The runner joins the arguments into one line for the remote shell, wrapping those with a
    space in double quotes (escaping ``"`` only), and pdsh substitutes ``%`` sequences. So: ``%``
    becomes ``%%``; an argument with a space gets ``\\``, ``$`` and a backquote escaped (the
    runner adds the double quotes); any other argument that is not a plain word is single-quoted.
    """
    value = value.replace("%", "%%")
    if SHELL_LITERAL.fullmatch(value):
        return value
    if " " in value:
        return re.sub(r"([\\$`])", r"\\\1", value)
    return shlex.quote(value)


def pdsh_env_value(value: str) -> str:
    """An environment value as it must stand in ``deepspeed_env`` for the pdsh runner: the runner
    wraps a value that is not a plain word in double quotes without escaping anything, so ``\\``,
    ``$``, a backquote and ``"`` are escaped here, and ``%`` doubled for pdsh."""
    value = value.replace("%", "%%")
    return re.sub(r'([\\$`"])', r"\\\1", value)


def env_file_text(spec: RunSpec, env: Mapping[str, str]) -> str:
    """``deepspeed_env`` (``KEY=VALUE`` lines) with each value encoded for the spec's runner."""
    encode = pdsh_env_value if through_pdsh(spec) else str
    return "".join(f"{key}={encode(value)}\n" for key, value in env.items())


def _char_name(char: str) -> str:
    name = unicodedata.name(char, "") or ("line break" if char in "\r\n" else "control")
    return f"{char!r} ({name}, U+{ord(char):04X})"


def _first_control(value: str) -> str | None:
    return next((c for c in value if unicodedata.category(c).startswith("C")), None)


def _unpassable(launcher: str, value: str, encoded: bool) -> str | None:
    """The first character of an exported value that cannot reach remote ranks intact.

    ``encoded``: the value is written by :func:`env_file_text` (pdsh: escaped there), else it
    is copied by the runner as it is.
    """
    if c := _first_control(value):
        return c  # the env file holds one value per line; a shell line ends there
    if value != value.strip():
        return value[0] if value[0].isspace() else value[-1]  # the runner strips white space
    if launcher == "pdsh":
        if encoded:
            return None
        return next((c for c in value if c != " " and not SHELL_LITERAL.fullmatch(c)), None)
    if launcher == "slurm" and "," in value:
        return ","
    return next((c for c in value if not DS_UNQUOTED.fullmatch(c)), None)


def remote_value_problems(spec: RunSpec, environ: Mapping[str, str]) -> list[str]:
    """Values that would not reach the remote ranks intact, each naming the field and character.

    Under pdsh every Megatron argument is encoded (:func:`pdsh_word`) and every env-file value
    too (:func:`pdsh_env_value`); what the runner puts into the remote line itself (the upstream
    directory it ``cd``s to, the interpreter, the script) and the variables it copies from its
    own environment (:data:`DS_EXPORT_PREFIXES`) cannot be encoded and must be plain words.
    openmpi and slurm pass arguments as argv, but the runner's quotes would become part of an
    exported value, and slurm's ``--export=ALL,K=V`` list splits at commas.
    Control characters (line breaks, tabs, ...) are refused everywhere.
    """
    if spec.launcher not in REMOTE_LAUNCHERS or len(spec.cluster.hosts) < 2:
        return []
    problems: list[str] = []
    how = {
        "pdsh": "DeepSpeed's pdsh runner puts it into the remote shell line as it is",
        "openmpi": "DeepSpeed's openmpi runner would pass it to mpirun -x with quotes inside",
        "slurm": "DeepSpeed's slurm runner would pass it in srun --export=ALL,... as it is",
    }[spec.launcher]

    def refuse(field: str, value: str, char: str, why: str, fix: str) -> None:
        problems.append(f"{field} {value!r} contains {_char_name(char)}: {why}; {fix}")

    argv = launcher_command(spec, "/run", plain=True)
    script = script_index(argv)
    for flag, value in zip(argv[script + 1 :], argv[script + 2 :], strict=False):
        if flag.startswith("--") and not value.startswith("--") and (c := _first_control(value)):
            field = f"{flag.removeprefix('--').replace('-', '_')} ({flag})"
            refuse(field, value, c, "it cannot reach a remote rank intact",
                   "choose a value without control characters")  # fmt: skip
    if spec.launcher == "pdsh":
        plain = {"paths.upstream_dir": spec.paths.upstream_dir, "paths.python": spec.paths.python}
        for field, value in plain.items():
            if bad := next((c for c in value if not SHELL_LITERAL.fullmatch(c)), None):
                refuse(field, value, bad, f"{how} (cd, the interpreter, the script path)",
                       "move it to a path of letters, digits and ._-/+=:,@ "
                       "(MEGATRON_DEEPSPEED_DIR, or a venv at such a path)")  # fmt: skip
    exported = DS_EXPORT_PREFIXES + (("NCCL",) if spec.device == "cuda" else ())
    copied = {k: v for k, v in environ.items() if k.startswith(exported)}
    for key, value in copied.items():
        if bad := _unpassable(spec.launcher, value, encoded=False):
            refuse(f"environment variable {key}", value, bad,
                   f"DeepSpeed's runner copies {key} to every rank and {how}",
                   f"unset {key} or remove that character from it")  # fmt: skip
    for key, value in remote_environment(spec, environ.get("PATH", "")).items():
        if bad := _unpassable(spec.launcher, value, encoded=True):
            refuse(f"deepspeed_env {key}", value, bad, how, f"remove that character from {key}")
    return problems


def launcher_command(
    spec: RunSpec, run_dir: str, node_rank: int | str = NODE_RANK, *, plain: bool = False
) -> list[str]:
    """The full ``deepspeed ... pretrain_gpt.py ...`` argv.

    ``no_ssh`` commands carry ``node_rank`` (by default the symbolic :data:`NODE_RANK`). Through
    pdsh (:func:`through_pdsh`) the Megatron arguments are encoded for the remote shell
    (:func:`pdsh_word`) unless ``plain``: what the ranks receive is then exactly the plain argv.
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
    if spec.schedule_timers:
        argv.append(SCHEDULE_TIMERS_SCRIPT)
    argv.append(posixpath.join(spec.paths.upstream_dir, "pretrain_gpt.py"))
    args = megatron_args(spec, run_dir)
    if through_pdsh(spec) and not plain:
        args = [pdsh_word(a) for a in args]
    return argv + args


def script_index(argv: list[str]) -> int:
    """Index of ``pretrain_gpt.py`` in a launcher argv: what follows are Megatron's arguments."""
    for index, arg in enumerate(argv):
        if arg.endswith("/pretrain_gpt.py") or arg == "pretrain_gpt.py":
            return index
    raise ValueError("pretrain_gpt.py not in the command")
