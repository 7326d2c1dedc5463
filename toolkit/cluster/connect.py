"""This process's connection to a Ray cluster for :mod:`toolkit.cluster.every_node`: the one it has, or one made
for the call; ``ray`` missing, a malformed address or no cluster answering is one sentence.

``ray`` is imported only here, on first use: it is no dependency of this package.
"""

from __future__ import annotations

import logging
from typing import Any

from toolkit.errors import UsageError


def _import_ray() -> Any:
    try:
        import ray  # the Ray package (an absolute import: this module is toolkit.cluster.connect)
    except ImportError as exc:
        import sys

        raise UsageError(f"ray is not installed for {sys.executable} ({exc}); install the cluster's ray version "
                         "there (`pip install ray==<version>`), or run this on a node of the cluster") from None
    return ray


class connected:
    """``with connected(address) as (ray, address)``: this process's Ray connection, or one made for the call
    (and closed after it); ``ray`` missing or no cluster answering is one sentence."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.started = False

    def __enter__(self) -> tuple[Any, str]:
        if self.address not in (None, "auto"):
            _host_port(self.address)  # a malformed address is the caller's mistake, ray or not
        ray = _import_ray()
        if ray.is_initialized():
            if self.address not in (None, "auto"):
                raise UsageError(f"this process is already connected to a Ray cluster; pass address=None to use it, "
                                 f"or call ray.shutdown() before connecting to {self.address}")
            return ray, _cluster_address(ray, "the connected cluster")
        address = self.address or "auto"
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # ConnectionError, a version mismatch (RuntimeError), a bad address (ValueError)
            raise UsageError(f"no Ray cluster could be joined at {address!r}: {first_line(exc)} (start one with "
                             "`ray start --head`, or pass the head node's address)") from None
        self.started = True
        return ray, _cluster_address(ray, address)

    def __exit__(self, *exc: object) -> None:
        if self.started:
            import ray

            ray.shutdown()


CONNECT_TIMEOUT = 10.0  # seconds to open a TCP connection to a given head node address


def _check_reachable(address: str) -> None:
    """A named ``host:port`` must accept a TCP connection first: ray.init keeps retrying an address where
    no cluster listens, for ever, printing a warning every few seconds. ("auto" finds a running cluster
    on this machine, or fails at once.)"""
    import socket

    if address == "auto":
        return
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
                         "`ray start --head`, or pass the head node's address") from None


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"Ray address {address!r} is not HOST:PORT (the head node's address, e.g. 10.0.0.1:6379), "
                         "nor auto")
    return host.strip("[]"), int(port)


def _cluster_address(ray: Any, fallback: str) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an older Ray: the address the caller gave says enough
        return fallback


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
