"""How a command and its workers log: INFO and above, with the time and the logger's name. The kernel-rate
measurements that a fresh machine runs once (one line per kernel and shape, cached afterwards) are shown only
from WARNING up: a newcomer's first screen is the job's progress, not a page of "measuring ..." lines."""

from __future__ import annotations

import logging

QUIET_LOGGERS = ("engine.kernels.rates",)


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
