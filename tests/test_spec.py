"""Specs, presets and the single validator: every rule, with the equation and the numbers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import (
    PresetError,
    expand_strategies,
    load_model_file,
    load_models,
    load_strategies,
    parse_overrides,
    resolve_spec,
)
from launchers.config.project import megatron_args, to_flag
from launchers.config.spec import (
    PLACEHOLDER_PATHS,
    RunSpec,
    SpecError,
    spec_from_json,
    spec_hash,
    spec_to_json,
)

PATHS = PLACEHOLDER_PATHS
MODELS = load_models()
STRATEGIES = load_strategies()


def cluster(*slots: int) -> Any:
    text = "".join(f"node{i} slots={n}\n" for i, n in enumerate(slots))
    return parse_hostfile_text(text, "hf")


def spec(
    model: str = "tiny",
    strategy: str = "baseline",
    slots: tuple[int, ...] = (2,),
    device: str = "cpu",
    launcher: str | None = None,
    **overrides: Any,
) -> RunSpec:
    return resolve_spec(
        model, strategy, cluster(*slots), overrides, device=device, launcher=launcher, paths=PATHS
    )


def with_strategy(base: RunSpec, **changes: Any) -> RunSpec:
    return dataclasses.replace(base, strategy=dataclasses.replace(base.strategy, **changes))


def test_parameter_counts_are_computed() -> None:
    # l(12h^2 + 13h) + V h + s h + 2h, V padded to a multiple of 128 * TP.
    assert MODELS["tiny"].model.num_parameters() == 875_264  # V = 488 -> 512
    assert MODELS["small"].model.num_parameters() == 63_847_424  # "64M"
    assert MODELS["large"].model.num_parameters() == 354_871_296  # not 512M
    large = dataclasses.replace(MODELS["large"].model, vocab_size=50_304 - 47)  # 50257
    assert large.num_parameters() - 354_823_168 == 47 * 1024  # padding rows only
    assert MODELS["tiny"].model.num_parameters(tp=8) == 875_264 + (1024 - 512) * 128


# What upstream printed ("number of parameters on (tensor, pipeline) model parallel rank (t, p)")
# in the lab runs of the tiny model (tests/fixtures/lab-logs): (tp, pp, normalization) -> by stage.
PRINTED_TINY = {
    (1, 1, "layernorm"): [875_264],
    (2, 1, "layernorm"): [447_488],  # both tensor ranks
    (1, 2, "rmsnorm"): [477_952, 478_080],  # the last stage holds the tied embedding module too
}


@pytest.mark.parametrize(("layout", "printed"), list(PRINTED_TINY.items()), ids=str)
def test_parameter_count_per_rank_is_what_upstream_prints(layout, printed) -> None:
    tp, pp, norm = layout
    strategy = {(1, 1): "baseline", (2, 1): "tensor", (1, 2): "pipeline"}[(tp, pp)]
    run = spec("tiny", strategy)
    assert (run.normalization, run.parameters_per_stage) == (norm, printed)
    if tp == 1:  # summed over stages, the tied embedding (words and positions) counted once
        m = run.model
        tied = (run.padded_vocab_size + m.max_position_embeddings) * m.hidden_size
        assert run.num_parameters == sum(printed) - (pp - 1) * tied


@pytest.mark.parametrize("strategy", ["baseline", "tensor", "pipeline"])
@pytest.mark.parametrize("model", ["small", "large"])
def test_small_and_large_get_the_study_vocabulary_whatever_the_data(
    tmp_path: Path, model: str, strategy: str
) -> None:
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{" + ",".join(f'"t{i}": {i}' for i in range(488)) + "}")  # offline data
    paths = dataclasses.replace(PATHS, vocab_file=str(vocab))
    run = resolve_spec(model, strategy, cluster(1, 1), device="cpu", paths=paths)
    tp = run.strategy.tp
    assert run.data_vocab_size == 488 and run.model.vocab_size == 50_257
    assert run.padded_vocab_size == (50_304 if tp == 1 else 50_432)  # GPT-2's, as Megatron pads
    argv = megatron_args(run, "/r")
    divisor = int(argv[argv.index("--make-vocab-size-divisible-by") + 1])
    assert divisor * tp == run.padded_vocab_size  # Megatron multiplies the divisor by TP
    assert -(-488 // (divisor * tp)) * divisor * tp == run.padded_vocab_size
    assert not [a for a in run.adjustments if a.key == "vocab_size"]


def test_a_data_vocabulary_larger_than_the_preset_is_recorded_as_not_its_shape(tmp_path) -> None:
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{" + ",".join(f'"t{i}": {i}' for i in range(100_277)) + "}")
    paths = dataclasses.replace(PATHS, vocab_file=str(vocab))
    run = resolve_spec("small", "baseline", cluster(2), device="cpu", paths=paths)
    (change,) = [a for a in run.adjustments if a.key == "vocab_size"]
    assert (change.requested, change.applied) == (50_257, 100_277)
    assert "NOT the shape the preset names" in change.reason
    assert run.padded_vocab_size == 100_352
    assert run.num_parameters == MODELS["small"].model.num_parameters() + (100_352 - 50_304) * 512
    rule = r"the data's tokenizer has 100277 tokens > vocab_size\(50257\) padded to 50304"
    with pytest.raises(SpecError, match=rule):
        resolve_spec("small", "baseline", cluster(2), {"vocab_size": 50_257}, device="cpu",
                     paths=paths)  # fmt: skip


@pytest.mark.parametrize("model", list(MODELS), ids=list(MODELS))
@pytest.mark.parametrize("strategy", list(STRATEGIES), ids=list(STRATEGIES))
def test_every_preset_pair_resolves_on_a_large_enough_cluster(model: str, strategy: str) -> None:
    s = STRATEGIES[strategy]
    world = max(2, s.tp * s.pp)
    run = spec(model, strategy, slots=(world // 2, world // 2), device="cuda")
    assert run.world_size == run.strategy.tp * run.strategy.pp * run.dp
    assert run.name == f"{model}-{strategy}"
    assert run.launcher == "pdsh"
    assert spec_from_json(spec_to_json(run)) == run
    assert spec_hash(spec_from_json(spec_to_json(run))) == spec_hash(run)


def test_presets_on_gpu_reproduce_the_study() -> None:
    small, large = spec("small", device="cuda"), spec("large", device="cuda")
    assert (small.model.precision, small.training.activation_checkpointing) == ("fp16", True)
    assert (small.training.train_iters, small.training.log_interval) == (100, 10)
    assert (large.training.train_iters, large.model.global_batch_size) == (50, 16)
    assert [(a.key, a.requested, a.applied) for a in small.adjustments] == [
        ("micro_batch_size", 2, 1)
    ]
    assert "fails with a micro-batch > 1" in small.adjustments[0].reason
    assert (small.model.micro_batch_size, small.gradient_accumulation_steps) == (1, 4)  # DP 2


def test_cpu_adjusts_gpu_presets_and_records_why() -> None:
    run = spec("small", device="cpu")
    changed = {a.key: (a.requested, a.applied) for a in run.adjustments}
    assert changed == {
        "precision": ("fp16", "fp32"),
        "micro_batch_size": (2, 1),
        "activation_checkpointing": (True, False),
    }
    assert run.gradient_accumulation_steps == 8 // (1 * 2)
    assert all(a.reason for a in run.adjustments)


def test_overrides_win_and_explicit_bf16_is_kept_on_cpu() -> None:
    run = spec("small", device="cpu", train_iters=20, precision="bf16")
    assert (run.training.train_iters, run.model.precision) == (20, "bf16")
    assert "precision" not in {a.key for a in run.adjustments}


def test_overrides_from_the_command_line_are_typed() -> None:
    assert parse_overrides(["train_iters=20", "precision=bf16", "lr=3e-4"]) == {
        "train_iters": 20,
        "precision": "bf16",
        "lr": 3e-4,
    }
    assert parse_overrides(["activation_checkpointing=off"]) == {"activation_checkpointing": False}


def test_spec_hash_ignores_the_hostfile_path_only() -> None:
    a = spec()
    b = dataclasses.replace(a, cluster=dataclasses.replace(a.cluster, hostfile="elsewhere"))
    assert spec_hash(a) == spec_hash(b)
    assert spec_hash(a) != spec_hash(spec(train_iters=31))


INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "world-not-tp-pp-dp",
        {"strategy": "hybrid", "slots": (2,)},
        r"tp(2) * pp(2) * dp(0) != world_size(2): strategy 'hybrid' needs a world size that is a "
        r"multiple of tp * pp = 4",
    ),
    (
        "world-odd-with-tp",
        {"strategy": "tensor", "slots": (2, 1), "launcher": "pdsh"},
        r"tp(2) * pp(1) * dp(1) != world_size(3)",
    ),
    (
        "heads-not-divisible-by-tp",
        {"strategy": "tensor", "num_attention_heads": 1},
        r"num_attention_heads(1) % tp(2) = 1 != 0",
    ),
    (
        "layers-not-divisible-by-pp",
        {"strategy": "pipeline", "num_layers": 3},
        r"num_layers(3) % pp(2) = 1 != 0",
    ),
    (
        "global-batch-not-divisible",
        {"global_batch_size": 7},
        r"global_batch_size(7) % (micro_batch_size(1) * dp(2)) = 1 != 0",
    ),
    (
        "hidden-not-divisible-by-heads",
        {"hidden_size": 130},
        r"hidden_size(130) % num_attention_heads(4) = 2 != 0",
    ),
    (
        "seq-longer-than-positions",
        {"seq_length": 256},
        r"seq_length(256) > max_position_embeddings(128)",
    ),
    (
        "fp16-on-cpu",
        {"precision": "fp16"},
        r"precision 'fp16' on device cpu: DeepSpeed's CPU accelerator trains in fp32 or bf16",
    ),
    (
        "local-launcher-with-two-hosts",
        {"slots": (1, 1), "launcher": "local"},
        r"launcher 'local' starts ranks on this machine only, but hostfile hf lists 2 hosts",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_combinations(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        spec(**kwargs)


CHANGED: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "pp-with-zero2",
        "pipeline",
        {"zero_stage": 2},
        "pp(2) > 1 with zero_stage(2): ZeRO-2 and ZeRO-3 are incompatible with pipeline "
        "parallelism",
    ),
    (
        "pp-with-zero3",
        "pipeline",
        {"zero_stage": 3},
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
    ),
    (
        "offload-with-zero1",
        "zero2-offload",
        {"zero_stage": 1},
        "offload 'optimizer' with zero_stage(1): ZeRO-Offload needs zero_stage >= 2",
    ),
    (
        "param-offload-with-zero2",
        "zero3-offload",
        {"zero_stage": 2},
        "offload 'optimizer+params' with zero_stage(2): parameter offload needs zero_stage == 3",
    ),
]


@pytest.mark.parametrize(
    ("strategy", "changes", "message"), [c[1:] for c in CHANGED], ids=[c[0] for c in CHANGED]
)
def test_invalid_strategy_variants(strategy: str, changes: dict[str, Any], message: str) -> None:
    base = spec(strategy=strategy)
    with pytest.raises(SpecError, match=re.escape(message)):
        with_strategy(base, **changes)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_micro_batch_above_one_is_rejected_when_built_directly(device: str) -> None:
    base = spec(device=device)
    model = dataclasses.replace(base.model, micro_batch_size=2)
    with pytest.raises(SpecError, match=re.escape("micro_batch_size(2) != 1: upstream's")):
        dataclasses.replace(base, model=model)


def test_all_violations_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        spec(strategy="pipeline", num_layers=3, seq_length=256)
    assert "num_layers(3) % pp(2)" in str(info.value)
    assert "seq_length(256) > max_position_embeddings(128)" in str(info.value)


BAD_VALUES: list[tuple[str, list[str], type[Exception], str]] = [
    ("unknown-key", ["layers=4"], PresetError, "unknown key 'layers'; valid keys: num_layers,"),
    ("no-equals", ["train_iters"], PresetError, "expected key=value"),
    ("int-type", ["train_iters=x"], PresetError, "train_iters must be an integer; got 'x'"),
    ("float-type", ["lr=fast"], PresetError, "lr must be a number; got 'fast'"),
    ("bool-type", ["activation_checkpointing=maybe"], PresetError, "must be true or false"),
    ("literal", ["precision=fp8"], PresetError, "precision must be one of fp32, fp16, bf16"),
    ("zero-iters", ["train_iters=0"], SpecError, "train_iters must be an integer >= 1, got 0"),
    ("negative-layers", ["num_layers=-1"], SpecError, "num_layers must be an integer >= 1, got -1"),
    ("zero-heads", ["num_attention_heads=0"], SpecError, "num_attention_heads must be an integer"),
    ("port-range", ["master_port=70000"], SpecError, "master_port must be an integer in 1..65535"),
    ("min-lr-above-lr", ["min_lr=0.1"], SpecError, "0 <= min_lr(0.1) <= lr(0.001) does not hold"),
    ("master-addr", ["master_addr=a;b"], PresetError, "character ';' at position 2"),
]


@pytest.mark.parametrize(
    ("items", "error", "message"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES]
)
def test_bad_values(items: list[str], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        spec(**parse_overrides(items))


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(PresetError, match=r"unknown model 'huge'; valid: large, small, tiny"):
        spec("huge")
    with pytest.raises(PresetError, match=r"unknown strategy 'zero4'; valid: baseline, pipeline"):
        spec(strategy="zero4")
    with pytest.raises(PresetError, match=r"unknown strategy 'nope'"):
        expand_strategies("baseline,nope")
    assert expand_strategies("core") == [
        "baseline",
        "pipeline",
        "tensor",
        "zero1",
        "zero2",
        "zero3",
    ]
    assert len(expand_strategies("all")) == 9


PRESET_FILES = [
    ("unknown-key", "model:\n  layers: 4\n", r"bad\.yaml: model\.layers: unknown key; valid keys"),
    (
        "wrong-type",
        "model:\n  num_layers: four\n",
        r"model\.num_layers: num_layers must be an integer",
    ),
    ("missing-keys", "model:\n  num_layers: 4\n", r"model: missing key\(s\) hidden_size"),
    ("not-a-mapping", "- 1\n", r"expected a mapping at the top level"),
    ("bad-yaml", "model: [\n", r"not valid YAML"),
    ("top-level", "modle: {}\n", r"unknown top-level key\(s\) modle"),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in PRESET_FILES], ids=[c[0] for c in PRESET_FILES]
)
def test_bad_preset_files_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PresetError, match=message):
        load_model_file(path)


def test_to_flag() -> None:
    assert to_flag("num_layers", 4) == ["--num-layers", "4"]
    assert to_flag("deepspeed", True) == ["--deepspeed"]
    assert to_flag("fp16", False) == []
    assert to_flag("normalization", None) == []
    assert to_flag("deepspeed_config", "/r/ds.json", sep="_") == [
        "--deepspeed_config",
        "/r/ds.json",
    ]
