"""`python -m api.server.drain`: wait until this server has no speech request in flight or waiting and no live
session open, at most `--timeout` seconds; Kubernetes runs it as the pod's preStop hook (deploy/k8s/).

The hook runs before the pod gets SIGTERM, while Kubernetes takes the pod out of its Service, and uvicorn's
own drain after SIGTERM lasts 30 s at most (api/__main__.py): a longer stream would be cut. /metrics sums
every worker of the pod and forgets dead ones (api/metrics.py), so its live gauges say when the pod is
idle. A server that does not answer /metrics for `--unanswered` seconds is hung (or has no worker left),
so it has no stream to keep: the hook gives up at once instead of holding a restart for the whole timeout
(the kubelet runs it when the liveness probe kills the container too). Exit status 0 once idle, 1 if still
busy at the timeout or not answering (the pod then stops anyway).
"""

from __future__ import annotations

import argparse
import enum
import logging
import math
import sys
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from api.server.security import load_keys
from api.settings import get_settings

logger = logging.getLogger(__name__)

# A live session (api/live/session.py) holds an admission slot only while it speaks; between utterances it
# counts here, so a drain does not cut a voice agent's socket in a pause.
BUSY_GAUGES = ("kokoro_requests_in_flight", "kokoro_requests_waiting", "kokoro_live_sessions_open")
# Kubernetes removes a terminating pod from its Service's endpoints while the hook runs, not before: a
# request may still arrive in the first seconds, so the pod counts as idle only after this quiet time.
SETTLE_S = 5.0
POLL_S = 1.0
# How long /metrics may go unanswered before the server counts as hung: longer than a busy event loop's
# pause, far shorter than the liveness probe's kill window (deploy/k8s/cpu/deployment.yaml,
# deploy/k8s/gpu/statefulset.yaml).
UNANSWERED_S = 10.0
READ_TIMEOUT_S = 3.0


def busy_requests(metrics_text: str) -> float:
    """Speech requests in flight plus waiting, plus live sessions open, from a /metrics body."""
    families = text_string_to_metric_families(metrics_text)
    return sum(sample.value for family in families for sample in family.samples if sample.name in BUSY_GAUGES)


def read_metrics(url: str, key: str | None) -> str:
    request = urllib.request.Request(f"{url}/metrics")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:
        return str(response.read().decode())


class Outcome(enum.Enum):
    IDLE = "idle"
    BUSY = "still busy at the timeout"
    UNANSWERED = "not answering /metrics"


def wait_idle(
    busy: Callable[[], float],
    timeout: float,
    settle: float = SETTLE_S,
    unanswered: float = UNANSWERED_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Polls `busy()` until it has been 0 for `settle` seconds (IDLE), `timeout` has passed (BUSY), or every
    read has failed for `unanswered` seconds (UNANSWERED). A failed read counts as busy until then: a worker
    being replaced in a pod of several is covered by the others."""
    start = clock()
    idle_since: float | None = None
    failing_since: float | None = None
    while clock() - start < timeout:
        asked_at = clock()  # a read that fails may have waited READ_TIMEOUT_S: count from when it was sent
        try:
            requests = busy()
        except OSError as exc:
            logger.warning("drain: /metrics unreadable (%s)", exc)
            requests = float("nan")
        now = clock()
        if not math.isnan(requests):
            failing_since = None
        elif failing_since is None:
            failing_since = asked_at
        if failing_since is not None and now - failing_since >= unanswered:
            return Outcome.UNANSWERED
        idle_since = (idle_since or now) if requests == 0 else None
        if idle_since is not None and now - idle_since >= settle:
            return Outcome.IDLE
        sleep(POLL_S)
    return Outcome.BUSY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.server.drain", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8880", help="the server, from inside its pod")
    parser.add_argument("--timeout", type=float, required=True, help="longest wait, in seconds")
    parser.add_argument(
        "--unanswered",
        type=float,
        default=UNANSWERED_S,
        help="give up once /metrics has not answered for this many seconds (a hung server)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    key = _metrics_key()
    started = time.monotonic()
    outcome = wait_idle(
        lambda: busy_requests(read_metrics(args.url, key)), args.timeout, unanswered=args.unanswered
    )
    logger.info("drain: %s after %.0f s", outcome.value, time.monotonic() - started)
    return 0 if outcome is Outcome.IDLE else 1


def _metrics_key() -> str | None:
    """The first configured API key, where /metrics needs one (KOKORO_METRICS_REQUIRE_KEY)."""
    settings = get_settings()
    keys = load_keys(settings.api_keys, settings.api_keys_file) if settings.metrics_require_key else []
    return keys[0].secret.decode() if keys else None


if __name__ == "__main__":
    sys.exit(main())
