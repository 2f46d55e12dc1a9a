"""One home for each formula: the launcher and the analyzer count the same model the same way."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from analysis.metrics import rows as metrics
from analysis.runs import load
from analysis.theory import comm, formulas
from analysis.theory import setup as run_setup
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import PresetError, load_models, load_strategies, resolve_spec
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
    assert set(formulas.model_table()) == set(models)
    for name, shape in formulas.model_table().items():
        m = models[name].model
        assert shape.dims == (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length)
        assert shape.max_position_embeddings == m.max_position_embeddings
        assert shape.vocab_size == m.vocab_size
    for name, strategy in load_strategies().items():
        shape = formulas.strategy_table()[name]
        assert (shape.tp, shape.pp, shape.zero_stage) == (strategy.tp, strategy.pp,
                                                           strategy.zero_stage)  # fmt: skip
        assert shape.offload == strategy.offload


def test_steady_windows_drop_the_first() -> None:
    assert formulas.steady_windows([10, 20, 30]) == [20, 30]
    assert formulas.steady_windows([10]) == []
