"""streamback.progress: plain lines in a log (count, rate, time left, at the interval or when
asked), a tqdm bar on a terminal, and the libraries' own bars off in a log."""

import io
import os

import pytest

from streamback import progress as progress_module
from streamback.progress import Progress, plain_logs


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic as the progress module sees it, set by the test."""
    now = {"t": 100.0}
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now["t"])
    return now


def test_a_log_gets_plain_lines_with_rate_and_time_left(capsys, clock):
    meter = Progress("train", 60, unit="step", initial=20, every_s=30)  # resumed at step 20
    clock["t"] = 110.0
    meter.update(10, "loss 3.2")  # 10 s in: not yet a line
    assert capsys.readouterr().err == ""
    clock["t"] = 130.0
    meter.update(20, "loss 3.0")  # 30 s in: 30 steps done since the start, 1 step/s, 10 left
    assert capsys.readouterr().err == "[train] 50/60 step, 1.0 step/s, 0m10s left loss 3.0\n"
    meter.update(1, log=True)  # asked for: a line at once
    assert capsys.readouterr().err == "[train] 51/60 step, 1.0 step/s, 0m09s left\n"
    unknown = Progress("rolling", None, unit="window", every_s=None)
    clock["t"] = 3730.0
    unknown.update(3600)
    assert unknown.line() == "3,600 window, 1.0 window/s, 1h00m so far" and capsys.readouterr().err == ""


def test_a_terminal_gets_a_bar(monkeypatch, clock):
    terminal = Terminal()
    monkeypatch.setattr(progress_module.sys, "stderr", terminal)
    meter = Progress("tokenize", 1000, unit="tokens")
    meter.update(250, "12 documents")
    meter.write("a message above the bar")
    meter.close()
    out = terminal.getvalue()
    assert (
        "\r" in out
        and "tokenize:" in out
        and "250/1.00k" in out
        and "12 documents" in out
        and "a message above the bar\n" in out
    )


def test_plain_logs_turns_off_the_libraries_bars_in_a_log_only(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(progress_module.sys, "stderr", Terminal())
    plain_logs()
    assert "TQDM_DISABLE" not in os.environ
    monkeypatch.setattr(progress_module.sys, "stderr", io.StringIO())
    plain_logs()
    assert os.environ["TQDM_DISABLE"] == "1"
