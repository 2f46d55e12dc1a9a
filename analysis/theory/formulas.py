"""The one home of every GPT and network formula the launcher and the analyzer share.

Both packages import from here (``launchers`` already imports ``analysis``; nothing here imports
either package): the padded vocabulary, the parameter count (per rank and per replica), the
forward MACs and the FLOPs of an iteration (with activation recompute), the ring / bus-bandwidth
factors, the link efficiency, link-rate and size parsing, and the steady-state rule. The presets
(``megatron_configs/``) are read by ``analysis.theory.presets``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

Normalization = Literal["layernorm", "rmsnorm"]
"""Megatron's ``--normalization``: LayerNorm (weight + bias) or RMSNorm (weight only)."""

# ------------------------------------------------------------------------- GPT shape and size

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron's ``--make-vocab-size-divisible-by`` default: the vocabulary is padded to a multiple
of this times the tensor-parallel size (``megatron/tokenizer/tokenizer.py``
``_vocab_size_with_padding``)."""


def padded_vocab_size(vocab_size: int, tp: int = 1) -> int:
    """Vocabulary size after Megatron's padding to a multiple of 128 * TP."""
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-vocab_size // multiple) * multiple


def gpt_parameter_tensors(
    layers: int,
    hidden: int,
    positions: int,
    padded_vocab: int,
    normalization: Normalization | str = "layernorm",
    tp: int = 1,
    pp: int = 1,
    stage: int = 0,
    *,
    ffn: int | None = None,
) -> list[tuple[str, int]]:
    """Parameter tensors (name, elements) of one (tensor, pipeline) rank of pipeline ``stage``:
    the one parameter count of the project (launcher, analyzer, byte model).

    Megatron GPT with learned positions, per layer: QKV (3h x h + 3h), attention output
    (h x h + h), MLP (f x h + f, h x f + h; f = ``ffn``, ``--ffn-hidden-size``, 4h by default),
    two norms (2h each for LayerNorm, weight and bias; h for RMSNorm). TP splits the QKV, the
    attention output and both MLP weights, the QKV and first MLP biases (column parallel) and
    the word embeddings (V/tp rows); the attention-output and second MLP biases (row parallel)
    and the norms are replicated. The first stage holds the word embeddings and the learned
    positions (``positions`` = ``--max-position-embeddings``, times h); the last stage the final
    norm and, with PP > 1, GPTModelPipe's tied copy of the whole embedding module.
    """
    f = 4 * hidden if ffn is None else ffn
    norm = 2 * hidden if normalization == "layernorm" else hidden
    layer = [
        ("qkv.weight", 3 * hidden * hidden // tp),
        ("qkv.bias", 3 * hidden // tp),
        ("proj.weight", hidden * hidden // tp),
        ("proj.bias", hidden),
        ("fc1.weight", f * hidden // tp),
        ("fc1.bias", f // tp),
        ("fc2.weight", hidden * f // tp),
        ("fc2.bias", hidden),
        ("norm1", norm),
        ("norm2", norm),
    ]
    tensors = [(f"layer{i}.{n}", e) for i in range(layers // pp) for n, e in layer]
    embedding = [
        ("word_embeddings", padded_vocab * hidden // tp),
        ("position_embeddings", positions * hidden),
    ]
    if stage == 0:
        tensors = embedding + tensors
    if stage == pp - 1:
        tensors = [*tensors, ("final_norm", norm)]
        if pp > 1:
            tensors = tensors + embedding  # the last stage's tied EmbeddingPipe (word + position)
    return tensors


def gpt_parameters_on_rank(
    layers: int,
    hidden: int,
    positions: int,
    padded_vocab: int,
    normalization: Normalization | str = "layernorm",
    tp: int = 1,
    pp: int = 1,
    stage: int = 0,
    *,
    ffn: int | None = None,
) -> int:
    """What upstream prints as "number of parameters on (tensor, pipeline) model parallel rank
    (t, ``stage``)", the same for every tensor rank t (``megatron/training.py``): the sum of
    :func:`gpt_parameter_tensors`. Per layer and tensor rank, with f = 4h: the QKV, dense and
    two MLP weights 12h^2/tp; the QKV and first MLP biases 7h/tp; the dense and second MLP
    biases 2h; two norms."""
    tensors = gpt_parameter_tensors(
        layers, hidden, positions, padded_vocab, normalization, tp, pp, stage, ffn=ffn
    )
    return sum(e for _, e in tensors)


def gpt_parameters(
    layers: int,
    hidden: int,
    positions: int,
    padded_vocab: int,
    normalization: Normalization | str = "layernorm",
    *,
    ffn: int | None = None,
) -> int:
    """Parameters of one model replica: l(4h^2 + 2fh + 9h + f) + V h + s h + 2h with LayerNorm
    (f = 4h: l(12h^2 + 13h) + V h + s h + 2h), l(4h^2 + 2fh + 7h + f) + V h + s h + h with
    RMSNorm (no biases in the norms); f the FFN size (``ffn``, 4h by default), s the number of
    learned positions (``--max-position-embeddings``). Equals upstream's printed count at
    TP = PP = 1, and the sum over pipeline stages less the tied embedding."""
    return gpt_parameters_on_rank(layers, hidden, positions, padded_vocab, normalization, ffn=ffn)


def layer_macs(h: int, s: int, ffn: int | None = None) -> float:
    """Forward multiply-accumulates of one layer for one sample: 4 h^2 s + 2 h s^2 + 2 f h s
    (upstream ``megatron/utils.py`` ``throughput_calculator``; f = 4h by default)."""
    f = 4 * h if ffn is None else ffn
    return 4.0 * h * h * s + 2.0 * h * s * s + 2.0 * f * h * s


def forward_passes(recompute: bool) -> int:
    """Forward-pass equivalents of one training step: forward 1 + backward 2, plus one more
    forward with full activation recompute (``throughput_calculator``:
    ``checkpoint_activations_factor = 4 if args.checkpoint_activations else 3``)."""
    return 4 if recompute else 3


def backward_factor(recompute: bool) -> float:
    """Backward work in units of a backward without recompute (2 forwards): 1, or 1.5 with full
    recompute, whose backward runs the forward again first (:func:`forward_passes` - 1 = 3
    forwards; DeepSpeed ``activation_checkpointing/checkpointing.py`` and Megatron's
    ``megatron/core/tensor_parallel/random.py``: ``CheckpointFunction.backward`` calls
    ``ctx.run_function`` before ``torch.autograd.backward``). DeepSpeed's ``bwd_inner`` timer
    holds that recomputed forward."""
    return (forward_passes(recompute) - 1) / 2


def flops_per_iteration(
    batch: int, s: int, layers: int, h: int, v: int, ffn: int | None = None, recompute: bool = False
) -> float:
    """Model FLOPs of one iteration as upstream Megatron-DeepSpeed counts them.

    ``megatron/utils.py`` ``throughput_calculator`` (commit f4157bea): forward MACs =
    B l (4 h^2 s + 2 h s^2 + 2 f h s) + B V h s (no GQA, no swiglu, one expert), backward = 2x
    forward, FLOPs = 2 x MACs; with f = 4h this is 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Full
    activation recompute adds one forward (x 4/3, :func:`forward_passes`).
    """
    fwd_macs = batch * layers * layer_macs(h, s, ffn) + float(batch) * v * h * s
    return 2.0 * forward_passes(recompute) * fwd_macs


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a stage in a GPipe/1F1B schedule with balanced stages: (p-1)/(m+p-1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages({stages}) and micro_batches({micro_batches}) must be >= 1")
    return (stages - 1) / (micro_batches + stages - 1)


def zero_state_bytes(psi: float, stage: int, nd: int, precision: str = "bf16") -> float:
    """Model-state bytes per rank for Adam (ZeRO paper, Rajbhandari et al. 2020, section 3).

    Mixed precision (fp16/bf16, K = 12: fp32 master, momentum, variance): DP 16 Psi; ZeRO-1
    4 Psi + 12 Psi / Nd; ZeRO-2 2 Psi + 14 Psi / Nd; ZeRO-3 16 Psi / Nd.
    fp32 (derived): parameters 4, gradients 4, Adam moments 8 bytes per parameter; DeepSpeed's
    ZeRO optimizers also keep an fp32 copy of the rank's partition (``stage_1_and_2.py``
    ``single_partition_of_fp32_groups``: a clone even for an fp32 model, likewise in stage 3),
    so: DP 16 Psi (torch Adam, no copy); ZeRO-1 8 Psi + 12 Psi / Nd; ZeRO-2 4 Psi + 16 Psi / Nd;
    ZeRO-3 20 Psi / Nd. The partitions follow DeepSpeed 0.19.6: ``stage_1_and_2.py`` keeps the
    full low-precision parameters and (ZeRO-1) full gradients and partitions the fp32 copy and
    Adam moments (``single_partition_of_fp32_groups``); ZeRO-2 also partitions the gradients
    (``averaged_gradients`` of the rank's partition); ``stage3.py`` partitions the parameters too
    (``fp32_partitioned_groups_flat``).
    """
    if stage not in (0, 1, 2, 3) or nd < 1:
        raise ValueError(f"stage({stage}) must be 0-3 and nd({nd}) >= 1")
    if precision == "fp32":
        full, part = {0: (16, 0), 1: (8, 12), 2: (4, 16), 3: (0, 20)}[stage]
    else:
        full, part = {0: (16, 0), 1: (4, 12), 2: (2, 14), 3: (0, 16)}[stage]
    if stage == 0:
        return full * psi
    return full * psi + part * psi / nd


# ------------------------------------------------------------------------------ network

LINK_EFFICIENCY = 0.94
"""Fraction of the link rate a large transfer achieves on the wire: TCP payload over Ethernet
frames, 1448 of 1538 bytes per full frame with a 1500-byte MTU. The busbw a collective can reach
on a link of rate R is about 0.94 R; netbench's gloo all-reduce reached 0.93-0.96 of the emulated
link."""

_RING_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def ring_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of message with the ring algorithm; equals nccl-tests'
    bus-bandwidth factor (``PERFORMANCE.md``): all-reduce 2(n-1)/n; all-gather and
    reduce-scatter (n-1)/n; send/recv (``send_recv`` or netbench's ``sendrecv``) 1."""
    if n < 1:
        raise ValueError(f"group size({n}) must be >= 1")
    if op not in _RING_FACTORS:
        raise ValueError(f"op {op!r} has no ring factor; known: {', '.join(_RING_FACTORS)}")
    return _RING_FACTORS[op](n)


_RATE_RE = re.compile(
    r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>kbit|mbit|gbit|k|m|g)?(?:/s|ps)?\s*$", re.I
)
_RATE_MBIT = {"k": 1e-3, "m": 1.0, "g": 1e3}
UNSHAPED_WORDS = ("none", "unshaped", "unlimited", "off")
"""Spellings of "no rate limit" :func:`parse_rate` accepts."""


def parse_rate(text: str, bare_unit: Literal["mbit"] | None = None) -> float | None:
    """Mbit/s from ``100mbit``, ``1gbit``, ``500kbit``, ``10g``; ``none`` -> None (unshaped).

    Units are tc's (base 10: 1 mbit = 1e6 bit/s); ``/s`` or ``ps`` suffixes are accepted. A bare
    number is refused unless ``bare_unit`` says what it counts.
    """
    if text.strip().lower() in UNSHAPED_WORDS:
        return None
    match = _RATE_RE.match(text)
    if not match or (match["unit"] is None and bare_unit is None):
        raise ValueError(
            f"link rate {text!r} not understood: write e.g. '100mbit', '1gbit', '500kbit' or 'none'"
        )
    unit = (match["unit"] or bare_unit or "mbit")[0].lower()
    rate = float(match["num"]) * _RATE_MBIT[unit]
    if rate <= 0:
        raise ValueError(f"link rate {text!r} must be > 0 (or 'none' for an unshaped link)")
    return rate


RATE_IN_NAME = re.compile(r"(?<![a-z0-9])\d+(?:\.\d+)?(?:kbit|mbit|gbit)", re.I)
"""A link rate written into a run name (``tiny_tensor_1gbit``); read it with :func:`parse_rate`."""

_SIZE_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*$", re.I)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from ``1K``, ``64M``, ``1.5GiB``, ``2GB``, ``4096`` (binary units, as nccl-tests'
    ``-b/-e`` and cgroup limits read them)."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"size {text!r} not understood: write e.g. 1K, 64M, 2G or a byte count")
    return int(float(match["num"]) * _SIZE_UNITS[match["unit"].lower()])


# --------------------------------------------------------------------------- steady state

WARMUP_K = 3.5
"""A window is an outlier when it lies more than ``WARMUP_K`` robust scatters above the median:
the modified z-score cut of Iglewicz and Hoaglin (1993, *How to Detect and Handle Outliers*,
ASQC Quality Press), ``0.6745 (x - median) / MAD > 3.5``, i.e. 3.5 scaled MADs."""

SCATTER_FLOOR = 0.02
"""Least scatter, as a share of the median: the scaled MAD of near-equal windows is about 0 (a
run of identical rounded times), and a window a few percent slower is jitter, not warm-up; so
no window within 3.5 x 2% = 7% of the median is ever called warm-up or a pause."""

WARMUP_CAP = 3
"""At most ``len(windows) // WARMUP_CAP`` leading windows (and never fewer than the first) are
warm-up: a run whose times keep falling for longer is drifting, and that drift is not cut away
(the report says the cap was reached)."""

MIN_REFERENCE = 5
"""Reference windows the scatter needs before a window is judged by it: the MAD of four or
fewer windows swings with any one of them, so a shorter series keeps the first-window rule."""

PAUSE_MIN_RATIO = 1.25
"""A later window is a pause only when it is also at least this many times the median: a
checkpoint save or an evaluation stretches its window well past the iterations' own jitter,
while a window a few percent high is the run's scatter and stays in the mean (leaving it out
would bias the mean low)."""

STEADY_RULE = (
    "drop the first logging window (warm-up) and every following window more than 3.5 scaled "
    "MADs (at least 2% of the median each) above the median of the windows past the first third "
    "(modified z-score > 3.5, Iglewicz-Hoaglin), up to a third of the windows; later windows "
    "that far above the median and at least 1.25 times it are pauses (checkpoint, evaluation) "
    "and are left out of the mean, while at least half the steady windows remain (judged "
    "with 5 reference windows or more; else the first window only); each window is the mean "
    "over log_interval iterations"
)
"""How the steady state is chosen, for every figure that needs one (report: time, throughput,
TFLOP/s, timers; matrix table). The lab's per-iteration interface bytes have no window times:
they drop the first window only (bytes per iteration do not depend on time)."""

W = TypeVar("W", bound=Sequence)


@dataclass(frozen=True)
class SteadySplit:
    """Where :data:`STEADY_RULE` puts each window: warm-up, steady, or pause."""

    count: int
    """Windows in the series."""
    start: int
    """Index of the first steady window (windows before it are warm-up; at least 1)."""
    pauses: tuple[int, ...] = ()
    """Indices (>= ``start``) of the windows kept out of the steady mean as pauses."""
    median: float | None = None
    """Median of the reference windows (ms), None when the series was too short to judge."""
    threshold: float | None = None
    """Outlier bound (ms): median + 3.5 x scatter; None when not judged."""
    capped: bool = False
    """The warm-up reached the cap: the times were still above the bound there."""

    @property
    def kept(self) -> list[int]:
        """Indices of the steady windows, in order."""
        out = set(self.pauses)
        return [i for i in range(self.start, self.count) if i not in out]

    def select(self, windows: W) -> W:
        """The steady windows of ``windows`` (the same kind of sequence: a list, or a numpy
        array: a log-interval-1 run logs millions of windows)."""
        if not self.pauses:
            return windows[self.start :]  # type: ignore[return-value]
        # numpy (~0.1 s) here, not at the top: the launcher's CLI imports this module.
        import numpy as np

        if isinstance(windows, np.ndarray):
            return windows[np.asarray(self.kept, dtype=np.int64)]  # type: ignore[return-value]
        return [windows[i] for i in self.kept]  # type: ignore[return-value]


def steady_split(times: Sequence[float] | None, count: int | None = None) -> SteadySplit:
    """Apply :data:`STEADY_RULE` to the window times (ms per iteration, in order).

    The reference is the windows past the cap (``len // WARMUP_CAP``; all but the first when that
    is 1); ``threshold`` = its median + ``WARMUP_K`` x max(1.4826 x MAD, ``SCATTER_FLOOR`` x
    median). Leading windows above it, from the second on, are warm-up, up to the cap; steady
    windows above it are pauses when they are fewer than half the steady windows (more are not
    pauses but a run with two speeds, and all are kept). Without ``times`` (``count`` windows,
    times unknown), or with fewer than ``MIN_REFERENCE`` reference windows, only the first
    window is warm-up.
    """
    n = len(times) if times is not None else int(count or 0)
    if times is None or n < 3:
        return SteadySplit(count=n, start=min(1, n))
    # numpy (~0.1 s) here, not at the top: the launcher's CLI imports this module.
    import numpy as np

    t = np.asarray(times, dtype=float)
    cap = max(1, n // WARMUP_CAP)
    ref = t[cap:]
    ref = ref[~np.isnan(ref)]
    if len(ref) < MIN_REFERENCE:
        return SteadySplit(count=n, start=1)
    median = float(np.median(ref))
    scatter = max(1.4826 * float(np.median(np.abs(ref - median))), SCATTER_FLOOR * abs(median))
    threshold = median + WARMUP_K * scatter
    start = 1
    while start < cap and t[start] > threshold:
        start += 1
    capped = start == cap and cap > 1 and bool(t[start] > threshold)
    bound = max(threshold, PAUSE_MIN_RATIO * median)
    high = np.flatnonzero(t[start:] > bound) + start
    pauses = tuple(int(i) for i in high) if 2 * len(high) < n - start else ()
    return SteadySplit(n, start, pauses, median, threshold, capped)


def steady_windows(windows: W, times: Sequence[float] | None = None) -> W:
    """The windows :data:`STEADY_RULE` keeps, in order (:func:`steady_split` of ``times``, the
    windows' ms per iteration; without them only the first window is dropped); empty when only
    the warm-up window was logged. The same kind of sequence comes back."""
    return steady_split(times, count=len(windows)).select(windows)
