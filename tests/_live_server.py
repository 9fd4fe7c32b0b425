"""A FastAPI app served by uvicorn in a thread of the test process, on 127.0.0.1 (so stand-in
models serve, and a command run through typer's runner in this process reaches it over real HTTP)."""

from __future__ import annotations

import socket
import threading
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn in a thread of this process (so the stand-in models serve), on 127.0.0.1."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LiveServer":
        import httpx

        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


