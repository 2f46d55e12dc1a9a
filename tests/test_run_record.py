"""The typed run.json record: versions, old spellings, errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analysis.runs.record import (
    SCHEMA_VERSION,
    Network,
    Outcome,
    RunRecord,
    RunRecordError,
    from_json,
    to_json,
)

RECORDS = Path(__file__).resolve().parent / "fixtures" / "run_records"
"""run.json documents of real lab runs (upstream f4157bea, DeepSpeed 0.19.6): version 1 as the
launchers wrote them before the record was typed, version 2 after; this machine's paths replaced
by /home/user/..."""
REAL = sorted(RECORDS.glob("*.json"))

V1_LAB_RUN: dict[str, Any] = {
    # The keys launchers wrote before the record was typed: render's run_record, execute's
    # outcome and limits, the lab's network (Lab.describe + the session's counters), the
    # session's repeat and the Slurm lab's slurm.
    "name": "tiny-zero1",
    "spec_hash": "0f3c",
    "spec": {"name": "tiny-zero1", "model": {"name": "tiny"}},
    "command": ["deepspeed", "--no_ssh", "pretrain_gpt.py"],
    "provenance": {
        "upstream": {"commit": "f4157bea", "patch": None},
        "deepspeed": "0.19.6",
        "torch": "2.14.1",
        "python": "3.11.7",
        "hostname": "lab",
        "hostfile_text": "n0 slots=1\nn1 slots=1\n",
        "environment": {"NCCL_DEBUG": "WARN"},
        "created": "2026-11-22T02:15:00+00:00",
    },
    "outcome": {
        "status": "completed",
        "kind": None,
        "reason": None,
        "exit_codes": {"node0": 0},
        "start": "2026-11-22T02:15:01+00:00",
        "end": "2026-11-22T02:16:01+00:00",
        "wall_s": 60.0,
        "last_iteration": 30,
        "train_iters": 30,
        "failure_line": None,
    },
    "limits": {
        "memory_bytes": 4 << 30,
        "memory": "4.0 GiB",
        "cgroup": "/sys/fs/cgroup/x",
        "cgroup_version": 2,
    },
    "network": {
        "kind": "emulated",
        "lab": "mds",
        "link": "100mbit",
        "rate_mbit": 100.0,
        "delay_ms": 0.0,
        "loss_pct": 0.0,
        "topology": "bridge",
        "transport": "ssh",
        "subnet": "10.77.0.0/24",
        "host_address": "10.77.0.1",
        "nodes": [
            {
                "name": "n0",
                "namespace": "mds-n0",
                "interface": "eth0",
                "host_interface": "v0",
                "address": "10.77.0.2",
            }
        ],
        "shaping": ["tc qdisc add dev v0 root tbf rate 100000kbit"],
        "segmentation": [],
        "burst_bytes": 12500,
        "burst_ms": 1.0,
        "node_cpu": {"cpus": 1.0, "machine_cpus": 2, "mechanism": None, "note": None, "nodes": {}},
        "counters": {"start": {}, "end": {}, "delta": {}},
        "per_iteration": None,
        "per_iteration_reason": "only 2 iteration lines were seen",
    },
    "repeat": {"group": "r3-abc", "round": 1, "rounds": 3},
    "slurm": {"job_name": "tiny-zero1", "job_id": 7, "state": "COMPLETED"},
    "stopped_leftovers": [123],
    "record_problems": ["run.json was unreadable (x); its bytes are kept in y"],
}


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_every_real_run_json_reads_and_round_trips(path: Path) -> None:
    record = from_json(json.loads(path.read_text()), str(path))
    assert from_json(to_json(record), "again") == record


def test_real_run_records_keep_what_the_runs_recorded() -> None:
    def read(name: str):
        return from_json(json.loads((RECORDS / name).read_text()), name)

    v1 = read("lab-100mbit-tensor-v1.json")  # network.rate_mbit as written then
    assert (
        "rate_mbit" in json.loads((RECORDS / "lab-100mbit-tensor-v1.json").read_text())["network"]
    )
    assert v1.network is not None and v1.network.link_mbit == 100.0
    assert v1.outcome is not None and v1.outcome.status == "completed"
    v2 = read("lab-1gbit-zero2-v2.json")
    assert v2.network is not None and v2.network.link_mbit == 1000.0
    assert v2.repeat is not None and v2.repeat.rounds == 3
    slurm = read("slurm-zero2-v1.json")
    assert slurm.slurm is not None and slurm.slurm["state"] == "COMPLETED"
    assert slurm.slurm["queue_after"] == [] and slurm.slurm["processes_after"] == []
    oom = read("oom-baseline-v2.json")
    assert oom.outcome is not None and (oom.outcome.status, oom.outcome.kind) == ("failed", "oom")
    assert oom.outcome.last_iteration == 3 and oom.limits is not None


def test_a_version_1_lab_run_reads_and_round_trips_as_version_2() -> None:
    record = from_json(V1_LAB_RUN, "run.json")
    assert record.schema_version == SCHEMA_VERSION == 2
    assert record.network == Network(**{
        **{k: v for k, v in V1_LAB_RUN["network"].items() if k != "rate_mbit"},
        "link_mbit": 100.0,
    })  # fmt: skip
    assert record.outcome is not None and record.outcome.wall_s == 60.0
    assert record.repeat is not None and (record.repeat.round, record.repeat.rounds) == (1, 3)
    doc = to_json(record)
    assert doc["schema_version"] == 2 and doc["network"]["link_mbit"] == 100.0
    assert "rate_mbit" not in doc["network"]
    assert from_json(json.loads(json.dumps(doc)), "again") == record


@pytest.mark.parametrize("key", ["rate_mbit", "rate_mbps", "mbit", "link_mbit"])
def test_version_1_link_rate_spellings_read_as_link_mbit(key: str) -> None:
    record = from_json({"network": {key: 250}}, "run.json")
    assert record.network is not None and record.network.link_mbit == 250.0


def test_version_1_latency_reads_as_delay_ms() -> None:
    record = from_json({"network": {"latency_ms": 5}}, "run.json")
    assert record.network is not None and record.network.delay_ms == 5.0


def test_version_1_spellings_that_disagree_are_an_error() -> None:
    with pytest.raises(RunRecordError, match=r"run.json: network: link_mbit and rate_mbit"):
        from_json({"network": {"link_mbit": 100, "rate_mbit": 1000}}, "run.json")


@pytest.mark.parametrize("key", ["rate_mbit", "rate_mbps", "mbit", "latency_ms"])
def test_version_2_accepts_only_link_mbit(key: str) -> None:
    with pytest.raises(RunRecordError) as err:
        from_json({"schema_version": 2, "network": {key: 100}}, "/logs/x/run.json")
    message = str(err.value)
    assert message.startswith(f"/logs/x/run.json: network.{key}: unknown field; ")
    assert "link_mbit" in message


@pytest.mark.parametrize(
    ("doc", "where", "what"),
    [
        ({"outcome": {"status": "done"}}, "outcome.status", "'done' is not one of 'generated'"),
        ({"outcome": {"wall_s": "60"}}, "outcome.wall_s", "'60' is not a number"),
        ({"outcome": {"exit_codes": {"n0": "x"}}}, "outcome.exit_codes.n0", "not an integer"),
        ({"repeat": {"group": "g", "round": 1}}, "repeat.rounds", "missing"),
        ({"command": "deepspeed x"}, "command", "str is not a list"),
        ({"provenance": {"environment": {"A": 1}}}, "provenance.environment.A", "not a string"),
        ({"network": {"nodes": [1]}}, "network.nodes[0]", "int is not an object"),
        ({"nme": "x"}, "nme", "unknown field; remove it or rename it to one of "),
        ({"schema_version": 3}, "schema_version", "3 is not a known version; use 2"),
        ({"outcome": {"last_iteration": True}}, "outcome.last_iteration", "not an integer"),
    ],
)
def test_a_bad_field_is_named_with_its_file_and_path(doc: Any, where: str, what: str) -> None:
    with pytest.raises(RunRecordError) as err:
        from_json(doc, "logs/r/run.json")
    assert str(err.value).startswith(f"logs/r/run.json: {where}: ")
    assert what in str(err.value)


def test_not_an_object_is_an_error() -> None:
    with pytest.raises(RunRecordError, match=r"^run.json: document: top level is list"):
        from_json([1, 2], "run.json")


def test_to_json_leaves_out_absent_sections_and_keeps_fields_inside() -> None:
    doc = to_json(RunRecord(name="x", outcome=Outcome(status="generated")))
    assert set(doc) == {"schema_version", "name", "outcome"}
    assert doc["outcome"]["status"] == "generated" and doc["outcome"]["kind"] is None
    assert from_json(doc, "run.json") == RunRecord(name="x", outcome=Outcome(status="generated"))


@pytest.mark.parametrize(
    ("network", "version", "link"),
    [
        ({"rate_mbit": 100}, 1, 100.0),
        ({"rate_mbps": 100}, 1, 100.0),
        ({"mbit": 100}, 1, 100.0),
        ({"link_mbit": 100}, 1, 100.0),
        ({"link_mbit": 100}, 2, 100.0),
        ({"rate_mbit": 100}, 2, None),  # not a version-2 document: no link from it
    ],
)
def test_the_loader_reads_the_link_rate_through_the_record(
    network: dict[str, Any], version: int, link: float | None
) -> None:
    from analysis.runs.load import resolve_setup

    doc: dict[str, Any] = {"network": network | {"delay_ms": 5}}
    if version == 2:
        doc["schema_version"] = 2
    setup, _ = resolve_setup("x", doc, None, None, None)
    assert setup.link_mbit == link
    assert setup.latency_ms == (5.0 if link else None)
    assert setup.sources.get("link_mbit") == ("run.json network" if link else None)


def test_update_run_json_validates_before_writing(tmp_path: Path) -> None:
    from launchers.run.execute import update_run_json

    path = tmp_path / "run.json"
    update_run_json(tmp_path, outcome={"status": "generated"})
    assert json.loads(path.read_text()) == {"schema_version": 2, "outcome": {"status": "generated"}}
    before = path.read_bytes()
    with pytest.raises(RunRecordError, match=r"run.json: network.rate_mbit: unknown field"):
        update_run_json(tmp_path, network={"rate_mbit": 100.0})
    with pytest.raises(RunRecordError, match=r"run.json: repeat.round: '1' is not an integer"):
        update_run_json(tmp_path, repeat={"group": "g", "round": "1", "rounds": 3})
    assert path.read_bytes() == before, "nothing written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    doc = update_run_json(tmp_path, network={"link_mbit": 100.0})
    assert from_json(doc, "run.json").network == Network(link_mbit=100.0)


def test_an_unreadable_run_json_with_a_bad_update_is_left_as_it_was(tmp_path: Path) -> None:
    from launchers.run.execute import update_run_json

    (tmp_path / "run.json").write_bytes(b'{"name": "tiny-b')
    with pytest.raises(RunRecordError, match=r"outcome.wall_s"):
        update_run_json(tmp_path, outcome={"status": "failed", "wall_s": "slow"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert (tmp_path / "run.json").read_bytes() == b'{"name": "tiny-b'


def test_a_version_1_document_stays_version_1_when_updated(tmp_path: Path) -> None:
    from launchers.run.execute import update_run_json

    (tmp_path / "run.json").write_text(json.dumps({"name": "x", "network": {"rate_mbit": 10}}))
    doc = update_run_json(tmp_path, repeat={"group": "g", "round": 1, "rounds": 2})
    assert "schema_version" not in doc and doc["network"] == {"rate_mbit": 10}
    assert from_json(doc, "run.json").network == Network(link_mbit=10.0)


def test_a_generated_run_directory_reads_back_through_the_record(tmp_path: Path) -> None:
    from launchers.config.hostfile import parse_hostfile_text
    from launchers.config.presets import resolve_spec
    from launchers.config.spec import PLACEHOLDER_PATHS
    from launchers.run.render import load_run_spec, read_run_record, render_run_dir

    hosts = parse_hostfile_text("localhost slots=2\n", "hostfiles/localhost")
    spec = resolve_spec("tiny", "zero1", hosts, paths=PLACEHOLDER_PATHS, device="cpu")
    run_dir = render_run_dir(spec, tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert to_json(read_run_record(run_dir)) == doc
    assert load_run_spec(run_dir) == spec


def test_metrics_read_identity_and_wire_bytes_from_the_record() -> None:
    from analysis.metrics.rows import wire_bytes
    from analysis.runs.identity import identity
    from analysis.theory.setup import RunSetup

    record = from_json(V1_LAB_RUN, "run.json")
    assert identity(record) == {"spec_hash": "0f3c", "repeat_group": "r3-abc", "repeat_round": 1}
    assert wire_bytes(record) == (None, "only 2 iteration lines were seen")
    per = {"max_tx_bytes": 4096, "bytes": {}, "method": "counters"}
    counted = from_json({"schema_version": 2, "network": {"per_iteration": per}}, "run.json")
    assert wire_bytes(counted) == (4096.0, "")
    assert wire_bytes(None)[0] is None
    bare = identity(None, RunSetup(model="tiny"))
    assert bare["spec_hash"].startswith("setup:") and bare["repeat_group"] is None
