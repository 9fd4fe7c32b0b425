"""An upgrade committed, then a model that fails to load for searching: the call returns the upgrade
and says so (the caller's ``log``, and the library's logger); it raised ``AttributeError`` before
(the ``log`` argument hid the module's logger), after the commit, with nothing said of it."""

from __future__ import annotations

import logging
from pathlib import Path

from nobackfill import Client
from nobackfill.client.local import LocalClient

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_an_upgrade_whose_models_fail_to_warm_returns_and_says_so(tmp_path, monkeypatch, caplog):
    c = Client(tmp_path / "c")
    c.create(MODELS / "world-old")
    c.add(texts=["a red cube", "a blue ball"])

    def fail(self):
        raise OSError("disk went away")

    monkeypatch.setattr(LocalClient, "warm", fail)
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger="nobackfill.client"):
        up = c.upgrade(MODELS / "world-new", log=said.append)
    assert up.current == c.status()["current"] and len(up.spaces) == 2
    note = "upgraded; a model did not load for searching (OSError: disk went away)"
    assert note in said and note in caplog.text
