"""The report's document model: a `Report` collects Markdown lines and plots; `section` registers a section."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Report:
    out: Path
    lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.lines += ["", "#" * level + " " + text, ""]

    def caption(self, text: str) -> None:
        self.lines += [f"*{text}*", ""]

    def text(self, text: str) -> None:
        self.lines += [text, ""]

    def table(self, header: list[str], rows: list[list], caption: str | None = None) -> None:
        if caption:
            self.caption(caption)
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("|" + "---|" * len(header))
        for row in rows:
            self.lines.append("| " + " | ".join(_fmt(c) for c in row) + " |")
        self.lines.append("")

    def figure(self, fig, name: str, caption: str) -> None:
        import matplotlib.pyplot as plt

        fig.tight_layout()
        fig.savefig(self.out / f"{name}.png", dpi=110)
        plt.close(fig)
        self.caption(caption)
        self.lines += [f"![{caption}]({name}.png)", ""]


SECTIONS: list[tuple[str, Callable[[Report], None]]] = []


def section(title: str) -> Callable[[Callable[[Report], None]], Callable[[Report], None]]:
    def add(fn: Callable[[Report], None]) -> Callable[[Report], None]:
        SECTIONS.append((title, fn))
        return fn

    return add


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
