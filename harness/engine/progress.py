"""Progress of anything long (enumeration, training, the simulator, report sections): a live tqdm bar on a
terminal, and on anything else (a CI log, a file, a pipe) plain lines -- one when it starts, one at most every
``every_s`` seconds with the count, rate and ETA, and one when it ends -- never ``\\r`` redraws."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


class LineProgress:
    """The subset of tqdm's interface the harness uses (update, set_postfix_str, write, close, iteration)."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 every_s: float = 10.0, file: TextIO | None = None) -> None:
        self.iterable, self.desc, self.unit, self.every_s = iterable, desc, unit, every_s
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.file = file or sys.stderr
        self.n, self.postfix, self.start = 0, "", time.monotonic()
        self.last = self.start
        self._line(f"{desc}: started" + (f" ({self.total} {unit})" if self.total else ""))

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(f"{self.desc}: {self._state(now)}")

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def write(self, text: str, file: TextIO | None = None) -> None:
        print(text, file=file or self.file, flush=True)

    def close(self) -> None:
        if self.start is not None:
            self._line(f"{self.desc}: done, {self._state(time.monotonic(), eta=False)}")
            self.start = None

    def _state(self, now: float, eta: bool = True) -> str:
        elapsed = now - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        text = f"{self.n}" + (f"/{self.total}" if self.total else "") + f" {self.unit} in {elapsed:.0f} s"
        if eta and self.total and rate > 0 and self.n < self.total:
            text += f", ETA {(self.total - self.n) / rate:.0f} s"
        return text + (f" ({self.postfix})" if self.postfix else "")

    def _line(self, text: str) -> None:
        print(text, file=self.file, flush=True)


class _Silent(LineProgress):
    def _line(self, text: str) -> None:
        pass


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool = True, file: TextIO | None = None, **tqdm_options: Any):
    """A tqdm bar if ``file`` (default stderr) is a terminal, else a `LineProgress`; silent when not ``enabled``."""
    file = file or sys.stderr
    if not enabled:
        return _Silent(iterable, total=total, desc=desc, unit=unit, file=file)
    if file.isatty():
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, file=file, **tqdm_options)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, file=file)
