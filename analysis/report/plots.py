"""Headless figures drawn from the metrics DataFrame (matplotlib Agg); one PNG per question."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

BREAKDOWN_PARTS = {
    "fwd_ms": "forward",
    "bwd_ms": "backward",
    "fwd_bwd_ms": "forward+backward",
    "optimizer_ms": "optimizer",
    "comm_ms": "communication (timed)",
    "other_ms": "not covered by any timer",
}
"""Breakdown columns -> legend labels, stacking order."""


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


def _shown(value: object) -> object:
    """A cell for a title: ``?`` for a missing value (None, NaN or ``pd.NA``, whose truth
    value raises)."""
    return "?" if value is None or pd.isna(value) else value  # type: ignore[arg-type]


def _title(group: str, frame: pd.DataFrame) -> str:
    first = frame.iloc[0]
    return (
        f"{group}\nGBS {_shown(first['global_batch_size'])}, "
        f"micro {_shown(first['micro_batch_size'])}, seq {_shown(first['seq_length'])}, "
        f"{_shown(first['precision'])}, {_shown(first['device'])}"
    )


def run_labels(rows: pd.DataFrame) -> list[str]:
    """Bar labels of single runs: the name, with ``r2`` for round 2 of a repeated matrix."""
    rounds = rows["repeat_round"] if "repeat_round" in rows else [None] * len(rows)
    return [
        str(name) + ("" if r is None or pd.isna(r) else f" r{int(r)}")
        for name, r in zip(rows["name"], rounds, strict=True)
    ]


def per_spec(rows: pd.DataFrame, sets: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per spec: the runs of a repeat set with two or more timed runs become one row,
    its time the set's mean with the between-run interval (summary.json ``repeats``: the
    results table's figures) and each breakdown part the mean over those runs; other runs stay
    as they are. In the order of each spec's first run."""
    out: list[pd.Series] = []
    done: set[int] = set()
    for i, row in rows.iterrows():
        if i in done:
            continue
        s = next((s for s in sets if row["path"] in s["runs"]), None)
        if s is None or (s.get("runs_timed") or 0) < 2:
            single = row.copy()
            single["name"] = run_labels(rows.loc[[i]])[0]
            out.append(single)
            continue
        members = rows[rows["path"].isin(s["runs"])]
        done.update(members.index)
        merged = row.copy()
        merged["name"] = f"{s['name']} (mean of {s['runs_timed']})"
        for col in ("iter_ms_mean", "iter_ms_ci95_lo", "iter_ms_ci95_hi"):
            merged[col] = s[col]
        for col in BREAKDOWN_PARTS:
            merged[col] = members[col].mean() if members[col].notna().any() else None
        out.append(merged)
    return pd.DataFrame(out)


def write_figures(
    frame: pd.DataFrame, out: Path, sets: list[dict[str, Any]] | None = None
) -> list[Path]:
    """Write the figures for every setup group with timed runs; returns the written paths.
    ``sets`` (summary.json's ``repeats``): the time and breakdown figures show one bar per
    spec, the mean over its repeats with the between-run interval (:func:`per_spec`)."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for group, all_rows in frame.groupby("setup_key", sort=True):
        all_rows = all_rows[all_rows["iter_ms_mean"].notna()]
        if all_rows.empty:
            continue
        slug = _slug(str(group))
        rows = per_spec(all_rows, [s for s in sets or [] if s["setup_key"] == group])
        labels = rows["name"].tolist()
        x = range(len(rows))

        fig, ax = plt.subplots(figsize=(7, 4))
        lo = (rows["iter_ms_mean"] - rows["iter_ms_ci95_lo"]).fillna(0)
        hi = (rows["iter_ms_ci95_hi"] - rows["iter_ms_mean"]).fillna(0)
        ax.bar(x, rows["iter_ms_mean"], yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_xticks(list(x), labels, rotation=30, ha="right")
        merged = len(rows) < len(all_rows)  # (repeats drawn as one bar per spec)
        ax.set_ylabel(
            "ms per iteration (mean, 95% CI"
            + ("; repeats: their mean,\nbetween-run CI)" if merged else ")")
        )
        ax.set_title(_title(str(group), rows), fontsize=9)
        written.append(_save(fig, out / f"time-{slug}.png"))

        mem = all_rows[all_rows["peak_mem_mb"].notna()]
        if not mem.empty:
            fig, ax = plt.subplots(figsize=(7, 4))
            ax.bar(range(len(mem)), mem["peak_mem_mb"], color="#55a868")
            ax.set_xticks(range(len(mem)), run_labels(mem), rotation=30, ha="right")
            kind = str(mem["mem_kind"].iloc[0])
            ax.set_ylabel("peak memory, MiB")
            ax.set_title(_title(str(group), mem) + f"\n{kind}", fontsize=9)
            written.append(_save(fig, out / f"memory-{slug}.png"))

        parts = [c for c in BREAKDOWN_PARTS if rows[c].notna().any()]
        if parts:
            fig, ax = plt.subplots(figsize=(7, 4))
            bottom = pd.Series(0.0, index=rows.index)
            for col in parts:
                values = rows[col].fillna(0.0).clip(lower=0.0)
                ax.bar(x, values, bottom=bottom, label=BREAKDOWN_PARTS[col])
                bottom = bottom + values
            untimed = rows[parts].isna().all(axis=1)
            if untimed.any():  # the iteration is known, its parts are not: say so, not a gap
                xs = [i for i, u in zip(x, untimed, strict=True) if u]
                ax.bar(xs, rows.loc[untimed, "iter_ms_mean"], fill=False, hatch="//",
                       edgecolor="0.5", label="iteration, no step timers (n/a)")  # fmt: skip
            ax.set_xticks(list(x), labels, rotation=30, ha="right")
            ax.set_ylabel("ms per iteration (steady state)")
            ax.set_title(_title(str(group), rows), fontsize=9)
            ax.legend(fontsize=7)
            written.append(_save(fig, out / f"breakdown-{slug}.png"))

        bw_cols = {
            "busbw_gbps_timers": "from timers",
            "busbw_gbps_inferred": "inferred",
            "busbw_gbps_measured": "netbench",
        }
        bw = all_rows[[c for c in bw_cols]].notna().any(axis=1)
        if bw.any():
            sub = all_rows[bw]
            fig, ax = plt.subplots(figsize=(7, 4))
            width = 0.25
            for k, (col, label) in enumerate(bw_cols.items()):
                xs = [i + (k - 1) * width for i in range(len(sub))]
                ax.bar(xs, sub[col].fillna(0.0), width, label=label)
            if "busbw_inferred_warning" in sub:
                # An inferred figure the report flags (!) is host cost and noise, not the link.
                for i, (value, warn) in enumerate(
                    zip(sub["busbw_gbps_inferred"], sub["busbw_inferred_warning"], strict=True)
                ):
                    if pd.notna(value) and isinstance(warn, str) and warn:
                        ax.annotate("(!)", (i, value), ha="center", va="bottom", fontsize=8)
            link = sub["link_mbit"].iloc[0]
            if pd.notna(link):
                ax.axhline(link / 1000.0, color="k", ls="--", lw=1, label="link rate")
            ax.set_xticks(range(len(sub)), run_labels(sub), rotation=30, ha="right")
            ax.set_ylabel("bus bandwidth, Gbit/s (missing = n/a)")
            ax.set_title(_title(str(group), sub), fontsize=9)
            ax.legend(fontsize=7)
            written.append(_save(fig, out / f"bandwidth-{slug}.png"))
    return written


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
