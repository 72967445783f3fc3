"""The report's document model: a `Report` collects Markdown lines and plots; `section` registers a section."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llm_inference_harness.engine.outputs import replacing


@dataclass
class Report:
    out: Path
    lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    here: str = ""  # "this machine at this commit": the source of whatever a section measures itself

    def heading(self, text: str, level: int = 2) -> None:
        self.lines += ["", "#" * level + " " + text, ""]

    def caption(self, text: str) -> None:
        self.lines += [f"*{text}*", ""]

    def text(self, text: str) -> None:
        self.lines += [text, ""]

    def table(self, header: list[str], rows: list[list], caption: str | None = None, source: str | None = None) -> None:
        """A Markdown table whose caption ends with the machine and commit its numbers came from (``source``,
        default: measured here, now)."""
        self.caption(f"{caption or ''}  Measured on {source or self.here}.".strip())
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("|" + "---|" * len(header))
        for row in rows:
            self.lines.append("| " + " | ".join(_fmt(c) for c in row) + " |")
        self.lines.append("")

    def figure(self, fig, name: str, caption: str, source: str) -> None:
        """Save ``fig`` as <name>.png with ``source`` (the machine and commit its numbers came from) written in
        the figure itself and in the caption.  At most MAX_SERIES labelled series per panel; labels, legends
        and the source line stay inside the saved image (bbox_inches="tight")."""
        import matplotlib.pyplot as plt

        for ax in fig.axes:
            labelled = [h for h in ax.get_legend_handles_labels()[1] if not h.startswith("_")]
            if len(labelled) > MAX_SERIES:
                raise ValueError(f"{name}: {len(labelled)} series in one panel, at most {MAX_SERIES} stay legible")
        fig.tight_layout()
        fig.text(0.005, 0.0, f"measured on {source}", fontsize=7, color="0.35", ha="left", va="top")
        with replacing(self.out / f"{name}.png") as tmp:  # a plot is written whole or not at all
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.caption(f"{caption}  Measured on {source}.")
        self.lines += [f"![{caption}]({name}.png)", ""]


MAX_SERIES = 6  # lines a reader can tell apart in one panel (the dashboard's limit too)
SECTIONS: list[tuple[str, Callable[[Report], None]]] = []
# Sections that run a sweep of their own (minutes on 2 cores), by title: what `harness run` leaves to
# `harness report`, so the main job's report holds what it measured and the quick benchmark pass.
SWEEPS: dict[str, str] = {}


def section(title: str, sweep: str | None = None) -> Callable[[Callable[[Report], None]], Callable[[Report], None]]:
    """Register a report section; ``sweep``: what it measures itself and how long that takes (leaves it out of the
    quick report)."""
    def add(fn: Callable[[Report], None]) -> Callable[[Report], None]:
        SECTIONS.append((title, fn))
        if sweep:
            SWEEPS[title] = sweep
        return fn

    return add


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
