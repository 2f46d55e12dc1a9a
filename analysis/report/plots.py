"""Headless figures drawn from the metrics DataFrame (matplotlib Agg); one PNG per question."""

from __future__ import annotations

from pathlib import Path

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


def write_figures(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Write the figures for every setup group with timed runs; returns the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for group, rows in frame.groupby("setup_key", sort=True):
        rows = rows[rows["iter_ms_mean"].notna()]
        if rows.empty:
            continue
        slug = _slug(str(group))
        labels = rows["name"].tolist()
        x = range(len(rows))

        fig, ax = plt.subplots(figsize=(7, 4))
        lo = (rows["iter_ms_mean"] - rows["iter_ms_ci95_lo"]).fillna(0)
        hi = (rows["iter_ms_ci95_hi"] - rows["iter_ms_mean"]).fillna(0)
        ax.bar(x, rows["iter_ms_mean"], yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_xticks(list(x), labels, rotation=30, ha="right")
        ax.set_ylabel("ms per iteration (mean, 95% CI)")
        ax.set_title(_title(str(group), rows), fontsize=9)
        written.append(_save(fig, out / f"time-{slug}.png"))

        mem = rows[rows["peak_mem_mb"].notna()]
        if not mem.empty:
            fig, ax = plt.subplots(figsize=(7, 4))
            ax.bar(range(len(mem)), mem["peak_mem_mb"], color="#55a868")
            ax.set_xticks(range(len(mem)), mem["name"].tolist(), rotation=30, ha="right")
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
        bw = rows[[c for c in bw_cols]].notna().any(axis=1)
        if bw.any():
            sub = rows[bw]
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
            ax.set_xticks(range(len(sub)), sub["name"].tolist(), rotation=30, ha="right")
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
