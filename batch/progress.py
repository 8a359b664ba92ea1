"""A job's progress: a live bar (rows/s, tokens/s, ETA) on a terminal, one plain line per interval otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int | None, done: int = 0, interval: float = 10.0, stream=None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total, self.done, self.interval = total, done, interval
        self.rows = self.tokens = 0
        self.started = self.shown = time.monotonic()

    def update(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        now = time.monotonic()
        if now - self.shown >= (0.2 if self.tty else self.interval):
            self.shown = now
            self._show(now)

    def _show(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.rows / elapsed
        at = self.done + self.rows
        eta = ""
        if self.total and rate > 0 and self.total > at:
            eta = f" ETA {_clock((self.total - at) / rate)}"
        of = f"/{self.total}" if self.total else ""
        text = f"{at}{of} rows  {rate:.1f} rows/s  {self.tokens / elapsed:.0f} tokens/s{eta}"
        if self.tty:
            share = min(at / self.total, 1.0) if self.total else 0.0
            bar = "#" * int(24 * share) + "." * (24 - int(24 * share))
            self.stream.write(f"\r[{bar}] {100 * share:5.1f}%  {text}  ")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.rows:
            self._show(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
