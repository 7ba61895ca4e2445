"""Idle unload over fake engines: when it is due, the scheduler freeing the model (and nothing holding it),
the reload a request causes, 503 + Retry-After past the wait bound, /ready and the metrics throughout,
/dev/unload and /dev/reload."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.engine.scheduling.lifecycle import EngineState, UnloadedEngine
from api.engine.scheduling.scheduler import Scheduler
from api.metrics import Metrics
from api.server.app import create_app
from api.server.engine_metrics import SchedulerMetrics
from api.server.idle import Activity, unload_due
from tests.fakes import FakeEngine, FakeLanedEngine, FakePhonemizer, FakeSteppedEngine
from tests.unit.conftest import StartClient
from tests.unit.test_api import make_settings, wait_ready
from tests.unit.test_scheduler import item


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("activity", "due"),
    [
        (Activity(in_flight=0, waiting=0, live_sessions=0, engine_idle_s=5.0), True),
        (Activity(in_flight=0, waiting=0, live_sessions=0, engine_idle_s=4.9), False),
        (Activity(in_flight=1, waiting=0, live_sessions=0, engine_idle_s=60.0), False),
        (Activity(in_flight=0, waiting=1, live_sessions=0, engine_idle_s=60.0), False),
        (Activity(in_flight=0, waiting=0, live_sessions=1, engine_idle_s=60.0), False),
        (Activity(in_flight=0, waiting=0, live_sessions=0, engine_idle_s=0.0), False),
    ],
)
def test_unload_is_due_only_with_no_work_for_the_whole_time(activity: Activity, due: bool) -> None:
    assert unload_due(activity, idle_s=5.0) is due


class Engines:
    """A factory of fake engines that remembers what it made (weakly: an unloaded one must be freed)."""

    def __init__(self, make: Callable[[int], FakeEngine] = lambda _: FakeEngine()) -> None:
        self.make = make
        self.made: list[weakref.ref[FakeEngine]] = []

    def __call__(self) -> FakeEngine:
        engine = self.make(len(self.made))
        self.made.append(weakref.ref(engine))
        return engine


@pytest.mark.parametrize("kind", [FakeEngine, FakeSteppedEngine, FakeLanedEngine])
def test_the_scheduler_frees_the_engine_and_a_chunk_loads_a_new_one(kind: type[FakeEngine]) -> None:
    engines = Engines(lambda _: kind())
    metrics = Metrics()

    async def main() -> None:
        scheduler = Scheduler(engines(), max_queued=8, rebuild=engines, observer=SchedulerMetrics(metrics))
        scheduler.start()
        assert len((await scheduler.submit(item(2), "a")).samples) == 2400
        assert scheduler.unload()
        await asyncio.to_thread(wait_for, lambda: scheduler.state is EngineState.UNLOADED)
        assert isinstance(scheduler.engine, UnloadedEngine)
        assert scheduler.engine.name == "fake"
        assert dict(scheduler.engine.vocab) == dict(kind().vocab)
        gc.collect()
        assert engines.made[0]() is None  # nothing holds the unloaded engine
        # A chunk submitted while unloaded waits for the reload it causes.
        assert len((await scheduler.submit(item(3), "b")).samples) == 3600
        assert scheduler.state is EngineState.READY
        assert len(engines.made) == 2
        assert engines.made[1]() is scheduler.engine
        assert scheduler.lanes == getattr(scheduler.engine, "lanes", 1)
        assert len((await scheduler.submit(item(1), "c")).samples) == 1200  # every lane serves again
        scheduler.stop()

    asyncio.run(main())
    assert metrics.model_loaded._value.get() == 1
    assert metrics.model_unloads._value.get() == 1
    assert metrics.model_reload_seconds._sum.get() > 0  # observed once


def test_an_unload_waits_for_the_running_call_and_a_new_chunk_cancels_it() -> None:
    engines = Engines(lambda _: FakeEngine(delay=0.3))

    async def main() -> None:
        scheduler = Scheduler(engines(), max_queued=8, rebuild=engines)
        scheduler.start()
        await asyncio.to_thread(wait_for, lambda: scheduler.state is EngineState.READY)
        running = scheduler.submit(item(2), "a")
        await asyncio.sleep(0.05)
        scheduler.unload()
        queued = scheduler.submit(item(1), "b")  # asked for before the unload was committed: cancels it
        await running
        await queued
        await asyncio.sleep(0.1)
        assert scheduler.state is EngineState.READY
        assert scheduler.unload()
        await asyncio.to_thread(wait_for, lambda: scheduler.state is EngineState.UNLOADED)
        scheduler.stop()

    asyncio.run(main())
    assert len(engines.made) == 1


def test_an_engine_given_as_such_is_never_unloaded() -> None:
    scheduler = Scheduler(FakeEngine(), max_queued=8)
    scheduler.start()
    wait_for(lambda: scheduler.state is EngineState.READY)
    assert not scheduler.can_unload
    assert not scheduler.unload()
    scheduler.stop()


@pytest.fixture
def make_client(tmp_path: Path, start_client: StartClient) -> Callable[..., TestClient]:
    def make(engines: Engines, **overrides: object) -> TestClient:
        settings = make_settings(tmp_path, **overrides)
        app = create_app(settings, phonemizer=FakePhonemizer(), engine_factory=engines)  # type: ignore[arg-type]
        return start_client(app)

    return make


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def speak(client: TestClient) -> object:
    return client.post("/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm"})


def test_an_idle_worker_unloads_stays_ready_and_a_request_reloads_it(
    make_client: Callable[..., TestClient],
) -> None:
    engines = Engines()
    client = make_client(engines, idle_unload_s=0.3)
    first = speak(client)
    assert first.status_code == 200  # type: ignore[attr-defined]
    assert metric(client, "kokoro_model_loaded") == 1
    wait_for(lambda: client.get("/ready").json()["status"] == "unloaded")
    ready = client.get("/ready")
    assert ready.status_code == 200  # an unloaded worker still takes requests: the probe must not fail
    assert ready.json()["model_loaded"] is False
    assert metric(client, "kokoro_model_loaded") == 0
    assert metric(client, "kokoro_model_unloads_total") == 1
    response = speak(client)
    assert response.status_code == 200  # type: ignore[attr-defined]
    assert response.content == first.content  # type: ignore[attr-defined]
    assert client.get("/ready").json()["model_loaded"] is True
    assert metric(client, "kokoro_model_loaded") == 1
    assert metric(client, "kokoro_model_reload_seconds_count") == 1
    assert len(engines.made) == 2


def test_a_reload_slower_than_the_bound_gets_503_and_goes_on(make_client: Callable[..., TestClient]) -> None:
    engines = Engines(lambda made: FakeEngine(load_delay=0.0 if made == 0 else 1.0))
    client = make_client(engines, reload_wait_s=0.2)
    assert client.post("/dev/unload").status_code == 202
    wait_for(lambda: client.get("/ready").json()["status"] == "unloaded")
    refused = speak(client)
    assert refused.status_code == 503  # type: ignore[attr-defined]
    assert refused.headers["retry-after"]  # type: ignore[attr-defined]
    assert refused.json()["error"]["code"] == "model_loading"  # type: ignore[attr-defined]
    reloading = client.get("/ready")
    assert reloading.status_code == 200
    assert reloading.json()["status"] == "reloading"
    wait_for(lambda: client.get("/ready").json()["status"] == "ready")
    assert speak(client).status_code == 200  # type: ignore[attr-defined]
    assert metric(client, 'kokoro_requests_total{status="503"}') == 1


def test_dev_unload_and_reload(make_client: Callable[..., TestClient]) -> None:
    engines = Engines()
    client = make_client(engines, api_keys="ops:sk-ops-1")
    assert client.post("/dev/unload").status_code == 401
    key = {"Authorization": "Bearer sk-ops-1"}
    assert client.post("/dev/unload", headers=key).status_code == 202
    wait_for(lambda: client.get("/ready").json()["status"] == "unloaded")
    assert client.post("/dev/reload", headers=key).json()["status"] in ("unloaded", "reloading", "ready")
    wait_for(lambda: client.get("/ready").json()["status"] == "ready")
    assert len(engines.made) == 2


def test_dev_unload_refuses_an_engine_it_cannot_replace(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        refused = client.post("/dev/unload")
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "unload_unsupported"
