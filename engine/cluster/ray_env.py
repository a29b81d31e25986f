"""Ray without importing ray: the cluster address (configured or typed), its validation,
the resources each run asks for, and whether a Ray sweep can start here. The sweep
module, the CLI, the pages and the driver all use these.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import socket
import time
from dataclasses import dataclass

from engine.config import ConfigError, env_number
from engine.run.ray_runs import DEFAULT_STOP_GRACE_S

RAY_ADDRESS_ENV = "PRECISION_LAB_RAY_ADDRESS"
MAX_GPUS_PER_RUN = 8
MAX_CPUS_PER_RUN = 64
# ray.init retries for many minutes against a port that is not a Ray head; fail sooner.
DEFAULT_CONNECT_TIMEOUT_S = 60.0
# The reachability probe before a sweep is created: connect plus the first answer, in all.
RAY_PROBE_TIMEOUT_S = 2.0
RAY_PROBE_TIMEOUT_ENV = "PRECISION_LAB_RAY_PROBE_TIMEOUT_S"

# host:port with a DNS name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS_RE = re.compile(r"^(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])"
                         r":(?P<port>\d{1,5})$")




@dataclass(frozen=True)
class RayOptions:
    """How each Ray task asks for resources, and how long a stop may take."""

    gpus_per_run: int = 1
    """GPUs each run reserves on a cluster with GPUs (training uses the first)."""
    cpus_per_run: int = 1
    """CPUs each run reserves; on a CPU-only cluster this is what Ray schedules by."""
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    """Seconds a run has to stop by itself before its Ray task is force-cancelled."""
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """Seconds the driver waits for the cluster to answer before the sweep fails."""

    def __post_init__(self) -> None:
        for name, high in (("gpus_per_run", MAX_GPUS_PER_RUN), ("cpus_per_run", MAX_CPUS_PER_RUN)):
            value = getattr(self, name)
            low = 0 if name == "gpus_per_run" else 1
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, value, f"a whole number in [{low}, {high}]")
        for name, low, example in (("stop_grace_s", 0, 5), ("connect_timeout_s", 1, 60)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not low <= value <= 600:
                raise ConfigError(name, value, f"seconds in [{low}, 600], e.g. {example}")


def default_ray_address() -> str:
    """The configured cluster (env PRECISION_LAB_RAY_ADDRESS), '' for local sweeps."""
    return os.environ.get(RAY_ADDRESS_ENV, "").strip()


def validate_ray_address(address: str) -> str:
    """'host:port' of the cluster's head (GCS), or 'auto' for the cluster this machine
    joined with `ray start`. Ray Client addresses (ray://) are refused: results are
    written next to the data directory by an actor on the driver's node, so the driver
    must run here, on a node of the cluster."""
    text = (address or "").strip()
    if text == "auto":
        return text
    if text.startswith("ray://"):
        raise ConfigError("ray_address", text,
                          "Ray Client (ray://) is not supported: join this machine to the "
                          "cluster (`ray start --address=HEAD:6379`) and give HEAD:6379 or auto")
    match = _ADDRESS_RE.fullmatch(text)
    if not match or not 1 <= int(match["port"]) <= 65535:
        raise ConfigError("ray_address", text,
                          "expected HOST:PORT of the Ray head, e.g. 10.0.0.5:6379, or auto")
    return text


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


RAY_ANY_ADDRESS_ENV = "PRECISION_LAB_RAY_ALLOW_ANY_ADDRESS"
# HTTP/2 connection preface and an empty SETTINGS frame: what a gRPC client (Ray's GCS
# client) sends first. A gRPC server (the Ray head's GCS) answers with a SETTINGS frame
# (type 4); an HTTP/1 server (this app's own port, a web server) answers "HTTP/1.1 400".
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def page_may_choose_address() -> bool:
    """Whether the app lets a viewer type any Ray address (the operator's choice): by
    default the page uses only $PRECISION_LAB_RAY_ADDRESS, so a page viewer cannot make
    the server connect to hosts and ports of their choosing."""
    return os.environ.get(RAY_ANY_ADDRESS_ENV, "").strip().lower() in ("1", "true", "yes")


def probe_timeout_s() -> float:
    """The probe's bound in seconds: $PRECISION_LAB_RAY_PROBE_TIMEOUT_S, default 2."""
    value, problem = env_number(RAY_PROBE_TIMEOUT_ENV, RAY_PROBE_TIMEOUT_S, 0.1, 60, "seconds")
    if problem:
        raise ConfigError(RAY_PROBE_TIMEOUT_ENV, os.environ[RAY_PROBE_TIMEOUT_ENV],
                          "seconds in [0.1, 60], e.g. 2")
    return value


def speaks_grpc(host: str, port: int, timeout_s: float | None = None) -> bool | str:
    """True when host:port answers an HTTP/2 connection preface with a SETTINGS frame (a
    gRPC server, as a Ray head's GCS is); otherwise why not. `timeout_s` bounds each
    connection attempt and then what is left of it the send and the first answer (a host
    name's lookup comes before, under the resolver's own timeout)."""
    timeout_s = probe_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        return f"no connection within {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    with conn:
        try:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(_H2_PREFACE)
            reply = conn.recv(64)
        except OSError:  # connected, but no answer to gRPC's preface in time
            return f"it did not answer gRPC within {timeout_s:g} s"
    if len(reply) >= 9 and reply[3] == 0x04:
        return True
    return "it does not speak gRPC" if reply else "it closed the connection without a word"


def ray_problem(address: str) -> str | None:
    """Why a Ray sweep cannot start now (plain words), or None when it looks possible.

    Checks without importing ray or joining the cluster: ray installed, address valid,
    the head's port answers gRPC (so this app's own port or a web server is not taken for
    a cluster). The driver reports anything deeper (e.g. a version mismatch) in the
    sweep's status.
    """
    if not ray_installed():
        return "Ray is not installed here: pip install -r requirements-ray.txt"
    try:
        address = validate_ray_address(address)
    except ConfigError as exc:
        return str(exc)
    if address == "auto":
        return None
    host, port = address.rsplit(":", 1)
    try:
        answer = speaks_grpc(host.strip("[]"), int(port))
    except ConfigError as exc:
        return str(exc)
    if answer is True:
        return None
    if any(words in str(answer) for words in ("gRPC", "without a word")):
        return (f"{address} is not a Ray cluster ({answer}); give the head's GCS port "
                "(6379 by default)")
    return (f"cannot reach the Ray cluster at {address} ({answer}); start its head with "
            f"`ray start --head --port {port}` or fix the address")
