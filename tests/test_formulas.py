"""One home for each formula: the launcher and the analyzer count the same model the same way."""

from __future__ import annotations

import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from analysis.metrics import rows as metrics
from analysis.runs import load
from analysis.theory import comm, formulas, presets
from analysis.theory import setup as run_setup
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import (
    CONFIG_DIR,
    PresetError,
    load_models,
    load_strategies,
    resolve_spec,
)
from launchers.config.project import ds_config, megatron_args
from launchers.config.spec import PLACEHOLDER_PATHS, SpecError
from launchers.run.render import read_run_record, render_run_dir

FOUR_RANKS = parse_hostfile_text("n0 slots=2\nn1 slots=2\n", "hostfiles/two-by-two")
CASES = [(m, s) for m in load_models() for s in load_strategies()]


@pytest.mark.parametrize(("model", "strategy"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_launcher_and_analyzer_count_the_same_parameters(
    tmp_path: Path, model: str, strategy: str, device: str
) -> None:
    """The count the launcher records in run.json equals the count the analyzer derives from
    that run directory (run.json, the Megatron command line, ds_config), per replica and per
    pipeline stage (the tensor-level plan ZeRO-3 uses). On CPU, PP runs use RMSNorm."""
    try:
        spec = resolve_spec(model, strategy, FOUR_RANKS, device=device,  # type: ignore[arg-type]
                            launcher="pdsh", paths=PLACEHOLDER_PATHS)  # fmt: skip
    except (PresetError, SpecError) as exc:
        pytest.skip(f"{model} x {strategy} is refused before it runs: {exc}")
    run_dir = render_run_dir(spec, tmp_path)
    cmd = shlex.join(["deepspeed", "pretrain_gpt.py", *megatron_args(spec, str(run_dir))])
    setup, _ = load.resolve_setup(spec.name, read_run_record(run_dir), ds_config(spec), cmd, None)
    assert setup.normalization == spec.normalization
    assert setup.padded_vocab_size == spec.padded_vocab_size
    assert metrics.num_parameters(setup) == spec.num_parameters
    per_stage = [sum(e for _, e in comm.param_tensors(setup, st)) for st in range(setup.pp or 1)]
    assert per_stage == spec.parameters_per_stage


FFN = 3 * 128
"""An FFN that is not 4h (h = 128): 384."""

TINY_FFN_COUNT = 4 * (4 * 128 * 128 + 2 * FFN * 128 + 9 * 128 + FFN) + 512 * 128 + 128 * 128 + 256
"""By hand, tiny with f = 3h and LayerNorm: l(4h^2 + 2fh + 9h + f) + V h + s h + 2h = 743,680
(875,264 with f = 4h)."""


def test_an_ffn_that_is_not_4h_on_the_analyzers_side() -> None:
    """The row's parameter count, the model-state column's tensors and the formula read
    ``ffn_hidden_size``; with f = 4h they are the counts upstream printed."""
    setup = run_setup.RunSetup(num_layers=4, hidden_size=128, seq_length=128,
                               ffn_hidden_size=FFN, padded_vocab_size=512)  # fmt: skip
    assert TINY_FFN_COUNT == 743_680
    assert metrics.num_parameters(setup) == TINY_FFN_COUNT
    assert comm.rank_parameters(setup) == TINY_FFN_COUNT
    assert formulas.gpt_parameters(4, 128, 128, 512, ffn=FFN) == TINY_FFN_COUNT
    assert formulas.gpt_parameters(4, 128, 128, 512, ffn=4 * 128) == 875_264
    tp2 = formulas.gpt_parameters_on_rank(4, 128, 128, 512, tp=2, ffn=FFN)
    assert tp2 == sum(e for _, e in comm.param_tensors(replace(setup, tp=2)))


def test_an_ffn_that_is_not_4h_on_the_launchers_side(tmp_path: Path) -> None:
    """A preset with ``ffn_hidden_size``: the launcher's count (``make list``, run.json), the
    flag it passes to Megatron, and the analyzer's count of the run it renders agree."""
    config = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, config)
    tiny = config / "tiny.yaml"
    text = tiny.read_text()
    assert "  vocab_size: 488" in text
    tiny.write_text(
        text.replace("  vocab_size: 488", f"  ffn_hidden_size: {FFN}\n  vocab_size: 488")
    )
    assert load_models(config)["tiny"].model.num_parameters() == TINY_FFN_COUNT
    spec = resolve_spec("tiny", "pipeline", FOUR_RANKS, device="cuda", launcher="pdsh",
                        paths=PLACEHOLDER_PATHS, config_dir=config)  # fmt: skip
    assert spec.num_parameters == TINY_FFN_COUNT
    run_dir = render_run_dir(spec, tmp_path / "logs")
    args = megatron_args(spec, str(run_dir))
    assert args[args.index("--ffn-hidden-size") + 1] == str(FFN)
    cmd = shlex.join(["deepspeed", "pretrain_gpt.py", *args])
    setup, _ = load.resolve_setup(spec.name, read_run_record(run_dir), ds_config(spec), cmd, None)
    assert setup.ffn_hidden_size == FFN
    assert metrics.num_parameters(setup) == TINY_FFN_COUNT
    per_stage = [sum(e for _, e in comm.param_tensors(setup, st)) for st in range(setup.pp or 1)]
    assert per_stage == spec.parameters_per_stage


def test_printed_counts_of_the_lab_logs() -> None:
    """Upstream's printed counts (tiny, 512-row vocabulary): dp2.log 875264 (LayerNorm), tp2.log
    447488 per tensor rank, pp2.log (RMSNorm) 477952 on the first stage and 478080 on the last."""
    assert formulas.gpt_parameters(4, 128, 128, 512) == 875_264
    assert formulas.gpt_parameters_on_rank(4, 128, 128, 512, tp=2) == 447_488
    pp2 = [formulas.gpt_parameters_on_rank(4, 128, 128, 512, "rmsnorm", pp=2, stage=st)
           for st in (0, 1)]  # fmt: skip
    assert pp2 == [477_952, 478_080]
    # A replica is the sum over stages less the tied copy of the embedding (V h + s h).
    assert formulas.gpt_parameters(4, 128, 128, 512, "rmsnorm") == sum(pp2) - (512 + 128) * 128


def test_positions_are_max_position_embeddings_not_seq_length() -> None:
    """s h counts the learned positions: 256 positions at seq 128 add 128 h parameters."""
    setup = run_setup.RunSetup(num_layers=4, hidden_size=128, seq_length=128,
                          max_position_embeddings=256, padded_vocab_size=512)  # fmt: skip
    assert metrics.num_parameters(setup) == 875_264 + 128 * 128


@pytest.mark.parametrize(
    ("vocab", "tp", "padded"),
    [(488, 1, 512), (512, 1, 512), (513, 1, 640), (50257, 1, 50304), (50257, 2, 50432),
     (50257, 4, 50688)],
)  # fmt: skip
def test_padded_vocab(vocab: int, tp: int, padded: int) -> None:
    assert formulas.padded_vocab_size(vocab, tp) == padded
    assert padded % (128 * tp) == 0 and padded - vocab < 128 * tp


def test_flops_recompute_adds_one_forward() -> None:
    """By hand: b=1, s=2, l=1, h=2, V=4: forward MACs
    4 h^2 s + 2 h s^2 + 2 (4h) h s + V h s = 32 + 16 + 64 + 16 = 128; FLOPs = 2 x 128 x 3 = 768
    without recompute, 2 x 128 x 4 = 1024 with."""
    assert formulas.flops_per_iteration(1, 2, 1, 2, 4) == 768
    assert formulas.flops_per_iteration(1, 2, 1, 2, 4, recompute=True) == 1024


@pytest.mark.parametrize(
    ("text", "bare", "mbit"),
    [("100mbit", None, 100.0), ("1gbit", None, 1000.0), ("500kbit", None, 0.5),
     ("10g", None, 10_000.0), ("2.5Gbit/s", None, 2500.0), ("none", None, None),
     ("250", "mbit", 250.0)],
)  # fmt: skip
def test_parse_rate(text: str, bare: str | None, mbit: float | None) -> None:
    assert formulas.parse_rate(text, bare_unit=bare) == mbit  # type: ignore[arg-type]


def test_parse_rate_bare_number_needs_a_unit() -> None:
    with pytest.raises(ValueError, match=r"write e\.g\. '100mbit'"):
        formulas.parse_rate("100")


@pytest.mark.parametrize(
    ("text", "nbytes"), [("1K", 1024), ("1.5GiB", 3 << 29), ("64mb", 64 << 20), ("4096", 4096)]
)
def test_parse_size(text: str, nbytes: int) -> None:
    assert formulas.parse_size(text) == nbytes


def test_ring_factor_rejects_unknown_op() -> None:
    with pytest.raises(ValueError, match="no ring factor"):
        formulas.ring_factor("broadcast", 2)


def test_tables_are_the_launchers_presets() -> None:
    """The analyzer's tables are read from the same files the launcher validates."""
    models = load_models()
    assert set(presets.model_table()) == set(models)
    for name, shape in presets.model_table().items():
        m = models[name].model
        assert shape.dims == (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length)
        assert shape.max_position_embeddings == m.max_position_embeddings
        assert shape.vocab_size == m.vocab_size
    for name, strategy in load_strategies().items():
        shape = presets.strategy_table()[name]
        assert (shape.tp, shape.pp, shape.zero_stage) == (strategy.tp, strategy.pp,
                                                           strategy.zero_stage)  # fmt: skip
        assert shape.offload == strategy.offload


def test_steady_windows_drop_the_first() -> None:
    assert formulas.steady_windows([10, 20, 30]) == [20, 30]
    assert formulas.steady_windows([10]) == []


def test_steady_split_finds_a_long_warm_up_and_pauses() -> None:
    # The profile: 132,508 ms, 67,124 ms, then 152 windows of 1,460-1,830 ms.
    times = [132508.0, 67124.0] + [1460.0 + (i * 37) % 371 for i in range(152)]
    split = formulas.steady_split(times)
    assert split.start == 2 and not split.capped and split.pauses == ()
    # median of the reference + 3.5 x max(1.4826 MAD, 2% of the median)
    ref = np.asarray(times[len(times) // 3 :])
    med = float(np.median(ref))
    bound = med + 3.5 * max(1.4826 * float(np.median(np.abs(ref - med))), 0.02 * med)
    assert split.median == med and split.threshold == pytest.approx(bound)
    # pauses (a checkpoint save every 5th window) are kept out, the rest kept
    paused = [100.0] * 20
    paused[7] = paused[14] = 400.0
    split = formulas.steady_split(paused)
    assert split.start == 1 and split.pauses == (7, 14)
    assert formulas.steady_windows(list(range(20)), paused) == [
        i for i in range(1, 20) if i not in (7, 14)
    ]
    assert list(formulas.steady_windows(np.arange(20), paused)) == [
        i for i in range(1, 20) if i not in (7, 14)
    ]


def test_steady_split_caps_a_drift_and_keeps_two_speeds() -> None:
    drift = [float(300 - 10 * i) for i in range(12)]  # falls all along: never flat
    split = formulas.steady_split(drift)
    assert split.start <= len(drift) // formulas.WARMUP_CAP
    bimodal = [100.0, 100.0] + [100.0, 300.0] * 6  # half the windows slow: not pauses
    assert formulas.steady_split(bimodal).pauses == ()
    flat = [10.0, 10.0, 10.0, 10.1, 10.0, 10.0]  # MAD 0: the 2% floor, nothing dropped
    assert formulas.steady_split(flat).start == 1 and formulas.steady_split(flat).pauses == ()
    assert formulas.steady_windows([10, 20, 30]) == [20, 30]  # no times: the first window only


def test_a_window_a_fifth_high_is_scatter_not_a_pause() -> None:
    # A real lab run (make demo's tiny baseline at 100 Mbit/s, log interval 1): iteration 4 took
    # 545.6 ms against a median of 452.8 ms, past 3.5 scaled MADs of so flat a series, but no
    # checkpoint or evaluation happened there: it stays in the mean.
    times = [536.0, 452.0, 451.5, 545.6, 453.0, 452.8, 452.1, 453.4]
    split = formulas.steady_split(times)
    assert split.threshold is not None and times[3] > split.threshold
    assert split.pauses == () and split.start == 1
    # At 1.25 times the median and beyond it is a pause.
    times[3] = 1.26 * 452.8
    assert formulas.steady_split(times).pauses == (3,)
