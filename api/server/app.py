"""The app factory: builds every service from settings and hangs them on app.state."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from api import __version__
from api.books.runner import JobRunner
from api.books.service import BookService
from api.books.store import open_store
from api.engine.base import Engine
from api.engine.choice import choose, cpu_flags
from api.engine.compiled import KernelStores
from api.engine.onnx_engine import OnnxEngine
from api.engine.scheduling.batching import BatchOverrides
from api.engine.scheduling.scheduler import Scheduler
from api.engine.shared import RemoteEngine
from api.engine.torch_engine import GPU_LANES, TorchEngine, cuda_has_native_bf16, select_device
from api.engine.voices import VoiceStore
from api.live.session import LiveService
from api.live.wyoming import WyomingServer
from api.metrics import Metrics
from api.protocol import OPENAI_VOICES
from api.server.admission import AdmissionMiddleware
from api.server.engine_metrics import SchedulerMetrics
from api.server.http_errors import install_error_handlers
from api.server.idle import IdleWatch, ReloadGate
from api.server.key_limits import DEFAULT_BURST_S, KeyLimitMiddleware, KeyPolicy, default_share
from api.server.logs import AccessLogMiddleware, configure_logging
from api.server.openapi import install_openapi
from api.server.request_metrics import RequestMetricsMiddleware
from api.server.routes import (
    agents,
    captions,
    engine_control,
    health,
    jobs,
    live,
    models,
    phonemes,
    speech,
    voices,
)
from api.server.routes.web import install_web
from api.server.security import ApiKeyMiddleware, LimitsMiddleware, required_keys
from api.settings import Settings, get_settings
from api.speech.admission import AdmissionController
from api.speech.service import SpeechService
from api.text.lexicon import Lexicon
from api.text.phonemize import Phonemizer
from api.voices.library import VoiceLibrary
from api.weights import ensure_weights
from api.weights.layout import shipped_config

logger = logging.getLogger(__name__)


# The paths that do work: admission control and request metrics apply to these only.
class SpeechPaths:
    """The exact paths of the speech endpoints, and the prefixes under which every path is one (ElevenLabs'
    /v1/text-to-speech/{voice_id}...)."""

    def __init__(self, exact: frozenset[str], prefixes: tuple[str, ...]) -> None:
        self.exact = exact
        self.prefixes = prefixes

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and (path in self.exact or path.startswith(self.prefixes))


SPEECH_PATHS = SpeechPaths(
    frozenset(
        {
            "/v1/audio/speech",
            "/dev/captioned_speech",
            "/dev/generate_from_phonemes",
            "/v1/speak",
            "/tts/bytes",
        }
    ),
    ("/v1/text-to-speech/",),
)
# Never behind an API key: orchestrators probe these.
OPEN_PATHS = frozenset({"/health", "/ready"})
# The voice and model lists, which Open WebUI reads without its key (KOKORO_LISTS_REQUIRE_KEY closes them).
LIST_PATHS = frozenset({"/v1/audio/voices", "/v1/audio/models"})
WEB_PATHS = frozenset({"/", "/web"})
JOBS_PATH = "/v1/audio/jobs"


def resolve_engine(settings: Settings) -> Settings:
    """The settings with `engine` and `torch_precision` made concrete; the choices are logged."""
    device = select_device(settings.device)
    choice, precision = choose(
        settings,
        device=device,
        flags=cpu_flags(),
        isa_cap=os.environ.get("ONEDNN_MAX_CPU_ISA"),
        gpu_bf16=device.startswith("cuda") and cuda_has_native_bf16(),
    )
    logger.info("engine: %s (%s)", choice.engine, choice.reason)
    update: dict[str, str] = {"engine": choice.engine}
    if choice.engine == "torch":
        logger.info("torch precision: %s (%s)", precision.precision, precision.reason)
        update["torch_precision"] = precision.precision
    return settings.model_copy(update=update)


def build_engine(
    settings: Settings, *, gpu_lanes: int = GPU_LANES, kernel_stores: KernelStores | None = None
) -> Engine:
    """The engine the settings name (resolved by `resolve_engine`), not yet loaded; a torch engine on a GPU
    runs `gpu_lanes` calls at once unless KOKORO_TORCH_LANES says otherwise, with its compiled kernels from
    `kernel_stores` (an engine built again after an idle unload reuses what the first one loaded)."""
    if settings.engine == "onnx":
        return OnnxEngine(
            settings.weights_dir,
            threads=settings.onnx_threads,
            stages=settings.onnx_stages,
            warmup=settings.warmup,
        )
    return TorchEngine(
        settings.weights_dir,
        device=settings.device,
        threads=settings.torch_threads,
        precision="fp32" if settings.torch_precision == "auto" else settings.torch_precision,
        compile=settings.torch_compile,
        seed=settings.seed,
        warmup=settings.warmup,
        lanes=settings.torch_lanes,
        gpu_lanes=gpu_lanes,
        compile_cache_root=settings.compile_cache_dir,
        ahead_of_time=None if settings.compile_ahead_of_time == "auto" else settings.compile_ahead_of_time,
        cuda_graphs=settings.cuda_graphs,
        kernel_stores=kernel_stores,
    )


def batch_overrides(settings: Settings) -> BatchOverrides:
    timeout_ms = settings.batch_timeout_ms
    return BatchOverrides(
        max_batch_size=settings.max_batch_size,
        batch_timeout=None if timeout_ms is None else timeout_ms / 1000,
        max_batch_tokens=settings.max_batch_tokens,
        launch_tokens=settings.launch_tokens,
    )


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    phonemizer: Phonemizer | None = None,
    engine_factory: Callable[[], Engine] | None = None,
) -> FastAPI:
    """The whole server. Tests pass their own settings, engine (or a factory of engines, which idle unload
    can replace) and phonemizer."""
    settings = settings or get_settings()
    if engine is None and engine_factory is None and settings.engine_socket is not None:
        # Its process fetches the weights and loads them, and counts the batches it runs (metrics).
        engine = RemoteEngine(settings.engine_socket, calls=settings.shared_engine_calls)
    real_weights = engine is None and engine_factory is None
    if real_weights:
        settings = resolve_engine(settings)
        stores = KernelStores(background=settings.compile_in_background)
        engine_factory = functools.partial(build_engine, settings, kernel_stores=stores)
    model: Engine = engine or engine_factory()  # type: ignore[misc]
    g2p = phonemizer or Phonemizer()

    def prepare() -> None:
        # The first G2P call loads spaCy and misaki's lexicons (1.5-2 s on a 2-core Xeon): in a thread of its
        # own beside the model's load and warm-up, whose torch calls let it run (docs/journal/
        # cpu-kernels-int8.md, entry 42). Nothing else calls the G2P before the engine is ready.
        with ThreadPoolExecutor(1, thread_name_prefix="g2p-warmup") as pool:
            voice = settings.default_voice
            g2p_warm = pool.submit(g2p.phonemize, "Hello.", voice[0]) if settings.warmup else None
            if real_weights:
                scheduler.stage = "checking the weights (fetched once, with progress in the log)"
                ensure_weights(settings)
            scheduler.stage = "loading the model and warming it up"
            scheduler.engine.load()  # not `model`: this closure would keep it after an unload
            scheduler.stage = "warming up the text front end"
            if g2p_warm is not None:
                g2p_warm.result()

    metrics = Metrics()
    scheduler = Scheduler(
        model,
        max_queued=settings.max_queued_chunks,
        prepare=prepare,
        observer=SchedulerMetrics(metrics, count_calls=not isinstance(model, RemoteEngine)),
        overrides=batch_overrides(settings),
        rebuild=engine_factory if engine is None else None,
    )
    voice_store = VoiceStore(
        settings.weights_dir / "voices", aliases=OPENAI_VOICES, custom_dir=settings.custom_voices_dir
    )
    lexicon = Lexicon.load(settings.lexicon_file) if settings.lexicon_file else None
    if lexicon is not None:
        logger.info("lexicon: %d entries from %s", len(lexicon), settings.lexicon_file)
    service = SpeechService(settings, scheduler, voice_store, g2p, lexicon)
    books = book_service(settings, service, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        watch = idle_watch(app, settings)
        tasks = [asyncio.create_task(watch.run())] if watch is not None else []
        if books is not None:
            tasks.append(asyncio.create_task(books.runner.run()))
        wyoming: WyomingServer | None = app.state.wyoming
        if wyoming is not None:
            await wyoming.start()
        yield
        if wyoming is not None:
            await wyoming.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        scheduler.stop()
        service.close()
        if books is not None:
            books.store.close()

    app = FastAPI(title="Kokoro OpenAI-compatible TTS", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.speech = service
    app.state.books = books
    app.state.voices = VoiceLibrary(voice_store, uploads=settings.voice_uploads)
    app.state.metrics = metrics
    install_error_handlers(app)
    install_openapi(app, max_input_chars=settings.max_input_chars, phoneme_symbols=shipped_config()["vocab"])
    for module in (speech, live, agents, captions, phonemes, models, voices, jobs, health, engine_control):
        app.include_router(module.router)
    if settings.web:
        install_web(app)
    _add_middleware(app, settings, metrics)
    app.state.live = LiveService(settings, service, app.state.admission, metrics)
    app.state.wyoming = WyomingServer(app.state.live, voice_store.names) if settings.wyoming else None
    return app


def _add_middleware(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    admission = AdmissionController(
        settings.max_inflight, settings.max_waiting, settings.max_wait_s, metrics=metrics
    )
    app.state.admission = admission
    # Starlette runs the last added middleware first. From the outside in: CORS (a browser's preflight is
    # answered before anything else), the access log, body and timeout limits, API keys, metrics (every
    # answer, the 429s and 503s included), each key's own limits, the reload gate (an idle-unloaded model
    # loads again before a request takes a slot), admission.
    app.add_middleware(AdmissionMiddleware, controller=admission, paths=SPEECH_PATHS)
    scheduler = app.state.speech.scheduler
    app.add_middleware(ReloadGate, scheduler=scheduler, paths=SPEECH_PATHS, wait_s=settings.reload_wait_s)
    keys = required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys)
    policy = key_policy(settings, len(keys))
    if keys and policy.bounded:
        app.add_middleware(
            KeyLimitMiddleware,
            policy=policy,
            paths=SPEECH_PATHS,
            mean_duration_s=lambda: admission.mean_duration_s,
            metrics=metrics,
        )
        logger.info(
            "per-key limits: %s in flight, %g a minute",
            policy.max_inflight or "no bound on requests",
            policy.rate_per_s * 60,
        )
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, paths=SPEECH_PATHS)
    if keys:
        open_paths = OPEN_PATHS if settings.metrics_require_key else OPEN_PATHS | {"/metrics"}
        # The page itself is open (it asks for a key); what it calls is not.
        app.add_middleware(
            ApiKeyMiddleware,
            keys=keys,
            open_paths=open_paths | WEB_PATHS,
            open_prefixes=("/web/",),
            open_reads=frozenset() if settings.lists_require_key else LIST_PATHS,
        )
        logger.info("API keys on: %d key(s) (%s)", len(keys), ", ".join(key.label for key in keys))
    books = app.state.books
    app.add_middleware(
        LimitsMiddleware,
        max_body_bytes=settings.body_limit,
        path_limits={JOBS_PATH: books.max_body_bytes} if books is not None else None,
        body_timeout_s=settings.body_timeout_s,
        send_timeout_s=settings.send_timeout_s,
    )
    app.add_middleware(AccessLogMiddleware, log_input=settings.log_input)
    origins = [origin.strip() for origin in settings.cors_origins.split(",") if origin.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["X-Request-Id", "Retry-After"],
            max_age=600,
        )


def key_policy(settings: Settings, keys: int) -> KeyPolicy:
    """Each key's limits per worker: the settings, or a fair share of the slots where none is set."""
    if settings.key_max_inflight is None:
        share = default_share(settings.max_inflight, keys)
    else:
        share = settings.key_max_inflight or None
    rate = settings.key_rate_per_minute / 60
    burst = settings.key_rate_burst or max(1.0, math.floor(rate * DEFAULT_BURST_S))
    return KeyPolicy(share, rate, burst)


def idle_watch(app: FastAPI, settings: Settings) -> IdleWatch | None:
    """The idle-unload watcher, where KOKORO_IDLE_UNLOAD_S is set and the engine can be unloaded (not the
    shared engine's proxy: that model lives in the engine process)."""
    scheduler = app.state.speech.scheduler
    if settings.idle_unload_s is None:
        return None
    if not scheduler.can_unload:
        logger.warning("KOKORO_IDLE_UNLOAD_S ignored: %s engines cannot be unloaded", scheduler.engine.name)
        return None
    live_service = app.state.live
    return IdleWatch(scheduler, app.state.admission, lambda: live_service.sessions, settings.idle_unload_s)


def book_service(settings: Settings, speech: SpeechService, metrics: Metrics) -> BookService | None:
    """Book jobs in PostgreSQL (KOKORO_JOBS_DATABASE) or under the data directory (None where neither is
    set), run by this worker's runner beside every other worker on the same store."""
    if settings.jobs_database:
        local = (
            settings.data_dir / "jobs" if settings.data_dir else Path(tempfile.gettempdir()) / "kokoro-jobs"
        )
        store = open_store(settings.jobs_database, local)
    elif settings.data_dir is not None:
        store = open_store(None, settings.data_dir / "jobs")
    else:
        return None
    return BookService(store, speech, JobRunner(store, speech, settings, metrics), settings)


def create_app_from_env() -> FastAPI:
    """uvicorn's factory (also in each worker process): settings come from the environment."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings)
