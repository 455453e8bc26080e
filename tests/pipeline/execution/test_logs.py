"""A command and its workers log at INFO, except the kernel-rate measurements of a first run (WARNING up)."""

import logging

from engine.kernels import rates
from jobs.common import setup_logging


def test_a_first_runs_kernel_measurements_stay_off_the_screen(caplog, monkeypatch):
    setup_logging()
    assert rates.log.getEffectiveLevel() == logging.WARNING
    with caplog.at_level(logging.INFO):
        rates.log.info("measuring int4 [1024, 1024] bfloat16 (never measured)")
        rates.log.warning("could not cache kernel rates")
    assert [r.getMessage() for r in caplog.records if r.name == rates.log.name] == ["could not cache kernel rates"]
