"""Which runs are repeats of one spec: the spec hash, repeat group and round of a run."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from analysis.runs.record import RunRecord
from analysis.theory.setup import RunSetup


def identity(record: RunRecord | None, setup: RunSetup | None = None) -> dict[str, Any]:
    """``spec_hash``, ``repeat_group`` and ``repeat_round`` of a run.

    ``spec_hash`` is run.json's; a run without one (bare logs, older run directories, a run.json
    that does not read as a record) gets ``setup:<digest>`` of its whole resolved setup, so logs
    of the same configuration (same model, batch, layout, ZeRO stage, precision, iterations,
    cluster and link, whatever their file names) are repeats of one spec. Not run as a repeat, a
    run has no group or round.
    """
    rep = record.repeat if record else None
    spec_hash = record.spec_hash if record else None
    if spec_hash is None and setup is not None:
        fields_ = {k: v for k, v in asdict(setup).items() if k != "sources"}
        text = json.dumps(fields_, sort_keys=True, default=str)
        spec_hash = "setup:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return {
        "spec_hash": spec_hash,
        "repeat_group": rep.group if rep else None,
        "repeat_round": rep.round if rep else None,
    }
