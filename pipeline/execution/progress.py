"""The driver's progress: a tqdm bar (rows done/total, completion tokens/s, ETA) when stderr is a terminal, else
one log line every `every` seconds."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, total_rows: int, done_rows: int, every: float, bar: bool | None = None):
        self.total, self.done, self.every = total_rows, done_rows, every
        self.tokens = 0
        self.run_rows = 0  # rows done by this run (not counting those committed by an earlier one)
        self.started = self._last_log = time.monotonic()
        self._bar = None
        if sys.stderr.isatty() if bar is None else bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_rows, initial=done_rows, unit="row", dynamic_ncols=True, file=sys.stderr)

    def add(self, rows: int, completion_tokens: int) -> None:
        self.done += rows
        self.run_rows += rows
        self.tokens += completion_tokens
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix_str(f"{self.tokens_per_s:.1f} tok/s", refresh=True)
        self.tick()

    @property
    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def eta_seconds(self) -> float | None:
        elapsed = time.monotonic() - self.started
        if self.run_rows <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / self.run_rows

    def tick(self) -> None:
        """A log line if `every` seconds have passed since the last one (no bar only)."""
        now = time.monotonic()
        if self._bar is not None or now - self._last_log < self.every:
            return
        self._last_log = now
        self.log_line()

    def log_line(self) -> None:
        eta = self.eta_seconds()
        eta_text = f", ETA {eta:.0f} s" if eta is not None else ""
        log.info("progress: %d/%d rows, %.1f completion tokens/s%s", self.done, self.total, self.tokens_per_s,
                 eta_text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
