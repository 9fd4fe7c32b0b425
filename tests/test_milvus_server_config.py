"""The Milvus server the tests and benchmarks start (``nobackfill.testing.milvus_server``): advertised
on 127.0.0.1, with chunks of growing segments large enough for Milvus' interim index (a backfill's
fresh rows are searched in growing segments; docs/storage.md)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("milvus", reason="the milvus server package is not installed")


class _FakeServer:
    """``milvus.MilvusServer`` with the package's real config template, recording it at ``start``."""

    started: list[str] = []
    template: str | None = None

    def __init__(self, wait_for_started: bool = True) -> None:
        from milvus import MilvusServerConfig

        self.config = MilvusServerConfig()
        if self.template is not None:
            self.config.template_text = self.template
        self.listen_port = 19530

    def set_base_dir(self, path: str) -> None:
        self.base = path

    def start(self) -> None:
        _FakeServer.started.append(self.config.template_text)


def test_the_server_gets_growing_chunks_of_the_interim_index_size_and_loopback(tmp_path, monkeypatch):
    import milvus

    from nobackfill.testing import milvus_server

    _FakeServer.started, _FakeServer.template = [], None
    monkeypatch.setattr(milvus, "MilvusServer", _FakeServer)
    running = milvus_server.start_server(tmp_path)
    assert running.address == "127.0.0.1:19530"
    (text,) = _FakeServer.started
    rows = re.findall(r"(?m)^\s*chunkRows:\s*(\d+)", text)
    assert rows == [str(milvus_server.GROWING_CHUNK_ROWS)] and milvus_server.GROWING_CHUNK_ROWS >= 1024
    assert "address: localhost" not in text


def test_a_config_without_the_setting_is_refused_by_name(tmp_path, monkeypatch):
    import milvus

    from nobackfill.testing import milvus_server

    _FakeServer.started, _FakeServer.template = [], "queryNode:\n  segcore:\n    other: 1\n"
    monkeypatch.setattr(milvus, "MilvusServer", _FakeServer)
    try:
        with pytest.raises(milvus_server.MilvusServerError, match="chunkRows"):
            milvus_server.start_server(tmp_path)
    finally:
        _FakeServer.template = None
    assert _FakeServer.started == []
