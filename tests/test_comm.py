"""Communication volume from the spec, checked against parameter counts printed by real runs and
the bytes seen on the wire between two emulated nodes (UPSTREAM.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import tiny_setup

from analysis.theory import comm
from analysis.theory.setup import RunSetup

PSI = 875264
"""Parameters of the tiny model, as the lab logs print them (dp2.log)."""


def tiny(tp: int = 1, pp: int = 1, zero: int = 0, nodes: int = 2, **kw) -> RunSetup:
    dp = 2 // (tp * pp)
    return tiny_setup(tp=tp, pp=pp, dp=dp, zero_stage=zero, world_size=2, nodes=nodes, **kw)


def total(setup: RunSetup, stage: int = 0) -> int:
    return sum(n for _, n in comm.param_tensors(setup, stage))


def test_parameter_tensors_match_printed_counts():
    assert total(tiny()) == PSI
    # tp2.log: "number of parameters on (tensor, pipeline) model parallel rank (0, 0): 447488"
    assert total(tiny(tp=2)) == 447488
    # pp2.log (rmsnorm): first stage 477952, last stage 478080 (holds word + position embeddings)
    pp2 = tiny(pp=2, normalization="rmsnorm")
    assert (total(pp2, 0), total(pp2, 1)) == (477952, 478080)


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 4, 0.75),
     ("reduce_scatter", 2, 0.5), ("send_recv", 2, 1.0)],
)  # fmt: skip
def test_ring_factor(op, n, factor):
    assert comm.ring_factor(op, n) == pytest.approx(factor)


def test_dp_is_one_fp32_gradient_allreduce_per_step():
    plan, why = comm.plan(tiny())
    assert why is None and plan is not None
    (c,) = plan.collectives
    assert (c.op, c.size_bytes, c.count_per_iter, c.group_size) == ("all_reduce", PSI * 4, 1, 2)
    assert c.link == "inter-node"
    assert plan.bytes_per_iter == PSI * 4


def test_zero2_allreduces_every_microstep_then_allgathers():
    plan, _ = comm.plan(tiny(zero=2))
    assert plan is not None
    ops = [(c.op, c.count_per_iter) for c in plan.collectives]
    assert ops == [("all_reduce", 4), ("all_gather", 1)]  # GAS = 8 / (1 * 2) = 4
    assert plan.bytes_per_iter == 4 * PSI * 4 + PSI * 4 / 2


def test_zero1_reduces_once_per_step():
    plan, _ = comm.plan(tiny(zero=1))
    assert plan is not None
    assert plan.bytes_per_iter == PSI * 4 + PSI * 4 / 2


def test_zero3_tiny_model_parameters_all_persist():
    # Every tiny-model tensor is <= 1e5 elements (stage3_param_persistence_threshold default).
    plan, _ = comm.plan(tiny(zero=3))
    assert plan is not None
    assert [c.purpose for c in plan.collectives] == [
        "gradients",
        "parameters (persistent, after step)",
    ]
    assert plan.bytes_per_iter == 4 * PSI * 4 / 2 + PSI * 4 / 2


def test_pipeline_sends_hidden_states_and_reduces_tied_embedding():
    plan, _ = comm.plan(tiny(pp=2, normalization="rmsnorm"))
    assert plan is not None
    act, tied = plan.collectives
    assert (act.op, act.size_bytes, act.count_per_iter) == ("send_recv", 128 * 128 * 4, 8)
    assert (tied.op, tied.size_bytes) == ("all_reduce", 512 * 128 * 4)
    assert plan.bytes_per_iter == 8 * 65536 + 262144


def test_tensor_parallel_allreduces_per_layer():
    plan, _ = comm.plan(tiny(tp=2, nodes=1))
    assert plan is not None
    acts = plan.collectives[0]
    # (4 per layer * 4 layers + embedding fwd + LM head bwd) per micro-batch, GAS 8 (dp = 1)
    assert acts.count_per_iter == 8 * 18
    assert acts.size_bytes == 128 * 128 * 4
    assert acts.link == "intra-node"


def test_tensor_parallel_recompute_repeats_the_forward_allreduces():
    """Full recompute runs each layer's forward again in backward: 6 all-reduces per layer.
    By hand, GAS 8: 8 x (6 x 4 + 2) = 208 calls of 128 x 128 x 4 = 65,536 B each; a ring of 2
    sends 2(2-1)/2 = 1 byte per byte: 208 x 65,536 = 13,631,488 B, 8 x 8 x 65,536 = 4,194,304
    more than without recompute (8 x 18 x 65,536 = 9,437,184)."""
    base, _ = comm.plan(tiny(tp=2, nodes=1, activation_checkpointing=False))
    again, _ = comm.plan(tiny(tp=2, nodes=1, activation_checkpointing=True))
    assert base is not None and again is not None
    assert again.collectives[0].count_per_iter == 8 * 26
    assert again.collectives[0].wire_bytes_per_rank == 13_631_488
    assert base.collectives[0].wire_bytes_per_rank == 9_437_184
    # The cross-entropy statistics sit outside the checkpointed layers: unchanged.
    assert again.collectives[1] == base.collectives[1]


def test_zero3_recompute_gathers_parameters_a_third_time():
    """With every tensor above the persistence threshold (threshold 0), ZeRO-3 gathers the
    whole model in forward, in the recomputed forward and in backward: by hand, PSI x 4 B
    each, GAS 4 on dp 2."""
    setup = tiny(zero=3, param_persistence_threshold=0, activation_checkpointing=True)
    plan, _ = comm.plan(setup)
    assert plan is not None
    gathers = [c for c in plan.collectives if c.op == "all_gather"]
    assert [c.purpose for c in gathers] == [
        "parameters (forward)", "parameters (recomputed forward)", "parameters (backward)"
    ]  # fmt: skip
    assert all(c.size_bytes == PSI * 4 and c.count_per_iter == 4 for c in gathers)
    plain, _ = comm.plan(replace(setup, activation_checkpointing=False))
    assert plain is not None
    assert plan.bytes_per_iter - plain.bytes_per_iter == 4 * PSI * 4 / 2  # one more, ring 1/2


# Bytes seen on the veth between two emulated nodes per iteration (UPSTREAM.md, tiny model,
# GAS 4): DP 3.8 MB, ZeRO-2 16.7 MB, PP 0.84 MB. The wire also carries Ethernet/IP/TCP headers
# (66-78 B per 1448 B segment, ~5%) and the ACKs of the received stream (~2%), so the payload
# model must sit 0-12% below the wire figure.
@pytest.mark.parametrize(
    ("setup", "wire_mb"),
    [(tiny(), 3.8), (tiny(zero=2), 16.7), (tiny(pp=2, normalization="rmsnorm"), 0.84)],
    ids=["dp", "zero2", "pp"],
)
def test_volume_matches_wire_observations(setup, wire_mb):
    plan, _ = comm.plan(setup)
    assert plan is not None
    ratio = wire_mb * 1e6 / plan.bytes_per_iter
    assert 1.0 <= ratio <= 1.12, f"wire / model = {ratio:.3f}"


def test_zero2_over_dp_ratio_matches_the_wire():
    dp, _ = comm.plan(tiny())
    z2, _ = comm.plan(tiny(zero=2))
    assert dp and z2
    assert z2.bytes_per_iter / dp.bytes_per_iter == pytest.approx(16.7 / 3.8, rel=0.05)


def test_incomplete_setup_gives_reason():
    plan, why = comm.plan(RunSetup(num_layers=4))
    assert plan is None and "hidden_size" in (why or "")


def test_bandwidth_units():
    # 125 MB in 1 s = 1 Gbit/s; all-reduce of n=2 busbw factor 1.
    assert comm.gbps(125e6, 1000.0) == pytest.approx(1.0)
    assert comm.busbw_gbps("all_reduce", 125e6, 1000.0, 4) == pytest.approx(1.5)


def test_measured_busbw_nearest_size():
    bench = {
        "backend": "gloo",
        "world_size": 2,
        "results": [
            {"op": "all_reduce", "bytes": 1 << 20, "time_ms": 10, "algbw_gbps": 0.8,
             "busbw_gbps": 0.8},
            {"op": "all_reduce", "bytes": 1 << 22, "time_ms": 35, "algbw_gbps": 0.9,
             "busbw_gbps": 0.9},
        ],
    }  # fmt: skip
    value, why = comm.measured_busbw(bench, "all_reduce", 3_501_056)
    assert value == 0.9 and "4,194,304" in why
    assert comm.measured_busbw(None, "all_reduce", 1)[0] is None
    assert comm.measured_busbw(bench, "all_gather", 1)[0] is None


def test_gloo_reduce_scatter_moves_allreduce_volume():
    # Seen on the emulated cluster's interface counters (ZeRO-3 tiny at 100 Mbit/s: 16.5 MB per
    # iteration on the wire, like ZeRO-2): on CPU (gloo) the gradient reduce-scatter costs an
    # all-reduce, 2(n-1)/n S per rank instead of (n-1)/n S.
    nccl, _ = comm.plan(tiny(zero=3))
    gloo, _ = comm.plan(tiny(zero=3, device="cpu"))
    assert nccl is not None and gloo is not None
    assert nccl.bytes_per_iter == 4 * PSI * 4 / 2 + PSI * 4 / 2
    assert gloo.bytes_per_iter == 4 * PSI * 4 + PSI * 4 / 2 == 15_754_752
    assert {c.backend for c in gloo.collectives} == {"gloo"}
