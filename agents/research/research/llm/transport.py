"""HTTP transport to an OpenAI-compatible endpoint over TCP or a Unix socket, via http.client.

`PATHFINDER_LLM_URL` is `http://HOST:PORT[/base]`, `https://HOST[:PORT][/base]` or
`unix:/path/to/socket`; requests go to `{base}/v1/chat/completions`.
"""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from research.config import ConfigError


class TransportError(ConnectionError):
    """The endpoint could not be reached or dropped the connection (retryable)."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix domain socket; the Host header says `localhost`."""

    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Endpoint:
    scheme: str            # "http", "https" or "unix"
    host: str
    port: int | None
    socket_path: str | None
    base_path: str

    @staticmethod
    def parse(url: str) -> "Endpoint":
        url = url.strip()
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            if not path.startswith("/"):
                raise ConfigError(
                    f"PATHFINDER_LLM_URL {url!r}: a unix socket path must be absolute")
            return Endpoint("unix", "localhost", None, path, "")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"PATHFINDER_LLM_URL {url!r}: expected http://HOST:PORT, https://HOST or unix:/path"
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"PATHFINDER_LLM_URL {url!r}: {exc}") from None
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return Endpoint(parts.scheme, parts.hostname, port, None, base)

    @property
    def chat_path(self) -> str:
        return f"{self.base_path}/v1/chat/completions"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "unix":
            assert self.socket_path is not None
            return UnixHTTPConnection(self.socket_path, timeout)
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)
