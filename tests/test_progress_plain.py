"""Progress where stderr is not a terminal: a plain line now and then (trial V: a long run in a log
said nothing at all), none for a short run."""

from __future__ import annotations

import nobackfill.progress as progress


def test_a_long_run_off_a_terminal_says_where_it_stands_now_and_then(monkeypatch, capsys):
    clock = iter(range(0, 1000, 7))  # each call of monotonic(): 7 s later
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))
    with progress.progress_bar(True, "train world-new", 20, unit="steps") as advance:
        for _ in range(20):
            advance()
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("train world-new: ") for line in err)
    assert "steps/s" in err[0] and "/20 (" in err[0] and len(err) < 20


def test_a_short_run_off_a_terminal_adds_no_line(capsys):
    with progress.progress_bar(True, "embedding", 100) as advance:
        for _ in range(100):
            advance()
    assert capsys.readouterr().err == ""


def test_a_bar_switched_off_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    with progress.progress_bar(False, "x", 3) as advance:
        advance(3)
    assert capsys.readouterr().err == ""
