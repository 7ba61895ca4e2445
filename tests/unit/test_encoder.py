"""The audio encoders: every format decodes back (with PyAV) to the audio that went in."""

from __future__ import annotations

import io
import logging
import struct
import wave
from collections.abc import Iterator
from dataclasses import dataclass

import av
import numpy as np
import pytest

from api.audio import CONTENT_TYPES, AudioFormat, create_encoder, to_int16
from api.audio.encoder import DEFAULT_MP3_KBPS, LameEncoder, PyAVEncoder

pytestmark = pytest.mark.unit

SAMPLE_RATE = 24_000
PIECES = (1000, 7001, 24_000, 333, 4800)  # uneven, cycled until the signal runs out
LOSSLESS = (AudioFormat.WAV, AudioFormat.FLAC, AudioFormat.PCM)
LOSSY = (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC)
CONTAINERS = tuple(fmt for fmt in AudioFormat if fmt is not AudioFormat.PCM)
# Frame buffering, codec look-ahead and 100 ms Ogg pages keep a stream up to about 0.2 s behind.
MAX_STREAM_LAG = SAMPLE_RATE // 4
STREAMING = pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])


@dataclass(frozen=True)
class Lossy:
    """What a lossy format decodes to, in samples at 24 kHz: `delay` leading samples that the container
    cannot tell the decoder to drop, then the input, then at most `max_padding` samples of end padding."""

    decoded_rate: int
    delay: int
    max_padding: int

    @property
    def ratio(self) -> int:
        return self.decoded_rate // SAMPLE_RATE


def lossy_expectation(fmt: AudioFormat, streaming: bool) -> Lossy:
    if fmt is AudioFormat.MP3 and streaming:
        # LAME's 576 + the decoder's 529 samples of delay, then padding to whole 576-sample frames, to
        # which LAME's flush sometimes adds one more frame. Nothing trims them: only a whole file (PyAV's
        # muxer on a seekable output) gets the Xing/LAME frame that carries the delay and padding.
        return Lossy(SAMPLE_RATE, delay=1105, max_padding=2 * 576)
    if fmt is AudioFormat.MP3:
        # The LAME frame lets ffmpeg trim exactly for most lengths; for some it keeps a few dozen extra.
        return Lossy(SAMPLE_RATE, delay=0, max_padding=576)
    if fmt is AudioFormat.AAC:
        # ADTS has no field for the 1024-sample priming frame, and the last frame is padded.
        return Lossy(SAMPLE_RATE, delay=1024, max_padding=1024)
    # Ogg Opus carries the pre-skip and the end granule, so it trims exactly. ffmpeg's Opus decoder
    # always outputs 48 kHz (the codec's internal rate) whatever rate was encoded, hence the ratio.
    return Lossy(48_000, delay=0, max_padding=0)


def aligned(decoded: np.ndarray, expected: Lossy, length: int) -> np.ndarray:
    """The part of the decoded audio that stands for the `length` input samples."""
    return decoded[expected.delay * expected.ratio : (expected.delay + length) * expected.ratio]


@dataclass(frozen=True)
class Decoded:
    samples: np.ndarray
    rates: set[int]
    channels: set[int]


def make_signal(seconds: float = 2.3) -> np.ndarray:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.default_rng(0).standard_normal(len(t))
    return (0.5 * np.sin(2 * np.pi * 220 * t) + 0.01 * noise).astype(np.float32)


def split(samples: np.ndarray) -> Iterator[np.ndarray]:
    start, index = 0, 0
    while start < len(samples):
        size = PIECES[index % len(PIECES)]
        yield samples[start : start + size]
        start, index = start + size, index + 1


def encode(fmt: AudioFormat, samples: np.ndarray, *, streaming: bool) -> tuple[bytes, bytes]:
    """The bytes returned before `finish` and those returned by it."""
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=streaming)
    early = b"".join(encoder.encode(piece) for piece in split(samples))
    return early, encoder.finish()


def encode_all(fmt: AudioFormat, samples: np.ndarray, *, streaming: bool) -> bytes:
    return b"".join(encode(fmt, samples, streaming=streaming))


def decode(data: bytes) -> Decoded:
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = list(container.decode(container.streams.audio[0]))
    planes = [frame.to_ndarray().reshape(-1) for frame in frames]
    return Decoded(
        samples=np.concatenate(planes) if planes else np.zeros(0),
        rates={frame.sample_rate for frame in frames},
        channels={frame.layout.nb_channels for frame in frames},
    )


def decode_int16(fmt: AudioFormat, data: bytes) -> np.ndarray:
    if fmt is AudioFormat.PCM:
        return np.frombuffer(data, dtype="<i2")
    decoded = decode(data)
    assert decoded.samples.dtype == np.int16
    return decoded.samples


def decoded_length(fmt: AudioFormat, data: bytes) -> float:
    """Decoded samples at 24 kHz (a truncated stream decodes as far as it goes)."""
    if fmt is AudioFormat.PCM:
        return len(data) / 2
    ratio = lossy_expectation(fmt, streaming=True).ratio if fmt in LOSSY else 1
    return len(decode(data).samples) / ratio


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples.astype(np.float64)))))


@pytest.fixture
def libav_logging() -> Iterator[None]:
    """Let FFmpeg's warnings through to the `libav.*` loggers while the test runs (PyAV mutes them)."""
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.WARNING)
    yield
    av.logging.set_level(previous)


def test_every_format_has_a_content_type() -> None:
    assert set(CONTENT_TYPES) == set(AudioFormat)
    assert CONTENT_TYPES[AudioFormat.OPUS] == "audio/ogg"
    assert CONTENT_TYPES[AudioFormat.MP3] == "audio/mpeg"


def test_to_int16_clips_scales_and_rounds_to_nearest() -> None:
    samples = np.array([-3.0, -1.0, -0.25, 0.0, 0.6 / 32767, 0.25, 1.0, 2.0], dtype=np.float32)
    assert to_int16(samples).tolist() == [-32767, -32767, -8192, 0, 1, 8192, 32767, 32767]


def test_to_int16_rejects_more_than_one_channel() -> None:
    with pytest.raises(ValueError, match="1-D"):
        to_int16(np.zeros((2, 10), dtype=np.float32))


@STREAMING
@pytest.mark.parametrize("fmt", CONTAINERS)
def test_decodes_as_mono_at_the_encoded_rate(fmt: AudioFormat, streaming: bool) -> None:
    decoded = decode(encode_all(fmt, make_signal(), streaming=streaming))
    expected_rate = lossy_expectation(fmt, streaming).decoded_rate if fmt in LOSSY else SAMPLE_RATE
    assert decoded.rates == {expected_rate}
    assert decoded.channels == {1}
    assert len(decoded.samples) > 0


@STREAMING
@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_formats_decode_to_the_exact_int16_samples(fmt: AudioFormat, streaming: bool) -> None:
    samples = make_signal()
    decoded = decode_int16(fmt, encode_all(fmt, samples, streaming=streaming))
    np.testing.assert_array_equal(decoded, to_int16(samples))


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_streaming_and_whole_decode_identically(fmt: AudioFormat) -> None:
    samples = make_signal()
    streamed = decode_int16(fmt, encode_all(fmt, samples, streaming=True))
    whole = decode_int16(fmt, encode_all(fmt, samples, streaming=False))
    np.testing.assert_array_equal(streamed, whole)


@STREAMING
@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_duration_matches_the_input(fmt: AudioFormat, streaming: bool) -> None:
    samples = make_signal()
    expected = lossy_expectation(fmt, streaming)
    decoded = decode(encode_all(fmt, samples, streaming=streaming)).samples
    extra = len(decoded) / expected.ratio - len(samples) - expected.delay
    assert 0 <= extra <= expected.max_padding


@STREAMING
@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_formats_keep_the_tail(fmt: AudioFormat, streaming: bool) -> None:
    samples = make_signal()
    expected = lossy_expectation(fmt, streaming)
    decoded = decode(encode_all(fmt, samples, streaming=streaming)).samples
    tail = aligned(decoded, expected, len(samples))[-480 * expected.ratio :]  # the last 20 ms
    assert rms(tail) == pytest.approx(rms(samples[-480:]), rel=0.2)


@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_streamed_bytes_keep_up_with_the_input(fmt: AudioFormat) -> None:
    """After each `encode`, what came back so far already decodes to all but the codec's latency."""
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=True)
    received, fed = b"", 0
    for piece in split(make_signal()):
        received += encoder.encode(piece)
        fed += len(piece)
        if fed > MAX_STREAM_LAG:
            assert decoded_length(fmt, received) >= fed - MAX_STREAM_LAG, f"after {fed} samples"
    assert len(received) > 0
    encoder.close()


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_whole_file_mode_returns_everything_from_finish(fmt: AudioFormat) -> None:
    early, rest = encode(fmt, make_signal(), streaming=False)
    assert early == b""
    assert len(rest) > 0


@STREAMING
@pytest.mark.parametrize("fmt", CONTAINERS)
@pytest.mark.usefixtures("libav_logging")
def test_encoding_logs_no_ffmpeg_warnings(
    fmt: AudioFormat, streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="libav")
    encode(fmt, make_signal(), streaming=streaming)
    messages = {record.getMessage() for record in caplog.records if record.name.startswith("libav")}
    # An unseekable output cannot have its FLAC STREAMINFO totals filled in afterwards; ffmpeg says so.
    known = {"unable to rewrite FLAC header."} if fmt is AudioFormat.FLAC and streaming else set()
    assert messages <= known


def test_whole_wav_is_read_by_the_wave_module() -> None:
    samples = make_signal()
    data = encode_all(AudioFormat.WAV, samples, streaming=False)
    with wave.open(io.BytesIO(data)) as wav:
        assert wav.getnframes() == len(samples)
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SAMPLE_RATE)
        assert wav.readframes(len(samples)) == to_int16(samples).tobytes()
    assert len(data) == 44 + 2 * len(samples)
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8  # the RIFF size, which `wave` ignores


def test_streamed_wav_has_unknown_sizes_and_the_header_first() -> None:
    samples = make_signal()
    encoder = create_encoder(AudioFormat.WAV, SAMPLE_RATE, streaming=True)
    first = encoder.encode(samples[:1000])
    rest = b"".join(encoder.encode(piece) for piece in split(samples[1000:])) + encoder.finish()
    data = first + rest
    assert first[:4] == b"RIFF"
    assert len(first) == 44 + 2000
    assert struct.unpack_from("<I", data, 4)[0] == 0xFFFFFFFF
    assert data[36:40] == b"data"
    assert struct.unpack_from("<I", data, 40)[0] == 0xFFFFFFFF
    assert data[44:] == to_int16(samples).tobytes()


def test_pcm_is_two_bytes_per_sample_and_nothing_else() -> None:
    samples = make_signal()
    early, rest = encode(AudioFormat.PCM, samples, streaming=True)
    assert rest == b""
    assert len(early) == 2 * len(samples)


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_out_of_range_samples_are_clipped(fmt: AudioFormat) -> None:
    samples = np.array([-3.0, -1.5, 0.25, 1.5, 7.0], dtype=np.float32)
    decoded = decode_int16(fmt, encode_all(fmt, samples, streaming=False))
    assert decoded.tolist() == [-32767, -32767, 8192, 32767, 32767]


@STREAMING
@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_formats_clip_out_of_range_samples(fmt: AudioFormat, streaming: bool) -> None:
    # Peaks near 2: RMS 1.41 unclipped, 0.88 clipped. libmp3lame and libopus clip on their own; the
    # native aac encoder does not, so this fails for aac without the encoder's own clip.
    loud = 4 * make_signal(0.5)
    expected = lossy_expectation(fmt, streaming)
    decoded = decode(encode_all(fmt, loud, streaming=streaming)).samples
    clipped = np.clip(loud, -1.0, 1.0)
    assert rms(aligned(decoded, expected, len(loud))) == pytest.approx(rms(clipped), rel=0.1)


@pytest.mark.parametrize("streaming", [True, False])
def test_empty_pcm_is_empty(streaming: bool) -> None:
    encoder = create_encoder(AudioFormat.PCM, SAMPLE_RATE, streaming=streaming)
    assert encoder.encode(np.zeros(0, dtype=np.float32)) == b""
    assert encoder.finish() == b""


@STREAMING
@pytest.mark.parametrize("fmt", CONTAINERS)
def test_empty_input_gives_a_decodable_file(fmt: AudioFormat, streaming: bool) -> None:
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=streaming)
    data = encoder.encode(np.zeros(0, dtype=np.float32)) + encoder.finish()
    decoded = decode(data).samples
    if fmt in LOSSY:
        # ffmpeg cannot open these containers without an audio packet, so one silent sample goes in.
        expected = lossy_expectation(fmt, streaming)
        assert len(decoded) <= (1 + expected.delay + expected.max_padding) * expected.ratio
        assert np.max(np.abs(decoded), initial=0.0) < 0.01
    else:
        assert len(decoded) == 0


@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_encode_after_finish_is_refused(fmt: AudioFormat) -> None:
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=True)
    encoder.finish()
    with pytest.raises(RuntimeError):
        encoder.encode(make_signal(0.1))


@pytest.mark.parametrize("fmt", CONTAINERS)
@pytest.mark.usefixtures("libav_logging")
def test_closing_an_abandoned_encoder_is_quiet(fmt: AudioFormat, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="libav")
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=True)
    encoder.encode(make_signal())
    encoder.close()
    del encoder
    assert not [record for record in caplog.records if record.name.startswith("libav")]


def speech_like(seconds: float, hiss: float = 0.0) -> np.ndarray:
    """A gliding harmonic tone under a syllable-rate envelope, with `hiss` (white noise's RMS) standing for
    the high band that fricatives fill: lossy coders have real work to do on it."""
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    phase = 2 * np.pi * np.cumsum(140 + 40 * np.sin(2 * np.pi * 0.7 * t)) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    noise = hiss * np.random.default_rng(0).standard_normal(len(t))
    return (0.2 * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2) * voiced + noise).astype(np.float32)


def mel_distance(fmt: AudioFormat, signal: np.ndarray, data: bytes, *, streaming: bool = False) -> float:
    """The log-mel distance (dB) of a file's or stream's decoded audio from the signal it was made from."""
    from api.weights.convert import spectral_distance

    decoded = aligned(decode(data).samples, lossy_expectation(fmt, streaming), len(signal))
    return spectral_distance(signal.astype(np.float64), decoded.astype(np.float64)).mel_db


def test_aac_with_the_fast_coder_stays_as_faithful_as_the_default_coder() -> None:
    """The server's AAC (ffmpeg's fast coder, chosen for its CPU cost) is as close to speech-like audio as
    ffmpeg's default coder gets."""
    signal = speech_like(3.0)

    def distance(options: dict[str, str]) -> float:
        output = io.BytesIO()
        with av.open(output, mode="w", format="adts") as container:
            stream = container.add_stream("aac", rate=SAMPLE_RATE, layout="mono", options=options)
            frame = av.AudioFrame.from_ndarray(signal.reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                container.mux(packet)
        return mel_distance(AudioFormat.AAC, signal, output.getvalue())

    ours = mel_distance(AudioFormat.AAC, signal, encode_all(AudioFormat.AAC, signal, streaming=False))
    assert abs(ours - distance({"aac_coder": "fast"})) < 0.05
    assert ours <= distance({}) + 0.25
    assert ours < 2.0


@pytest.mark.parametrize("kbps", [32, 96])
def test_mp3_is_made_at_the_bit_rate_asked_for(kbps: int) -> None:
    seconds = 4.0
    encoder = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=True, mp3_kbps=kbps)
    data = b"".join(encoder.encode(piece) for piece in split(speech_like(seconds))) + encoder.finish()
    assert 8 * len(data) / seconds == pytest.approx(1000 * kbps, rel=0.05)


@STREAMING
def test_lames_quality_reaches_the_encoder(streaming: bool) -> None:
    signal = speech_like(1.0, hiss=0.02)

    def encoded(quality: int) -> bytes:
        encoder = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=streaming, mp3_quality=quality)
        return encoder.encode(signal) + encoder.finish()

    assert encoded(3) != encoded(7)
    with pytest.raises(ValueError, match="0 to 9"):
        encoded(10)


def test_the_default_mp3_is_more_faithful_than_lames_own_choice() -> None:
    """LAME left to itself makes 32 kbit/s at 24 kHz mono, low-passed near 8 kHz; the server's default rate
    keeps the spectrum (docs/journal/encoders.md, entry 28)."""
    signal = speech_like(3.0, hiss=0.02)

    def distance(kbps: int) -> float:
        encoder = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=False, mp3_kbps=kbps)
        return mel_distance(AudioFormat.MP3, signal, encoder.encode(signal) + encoder.finish())

    default = mel_distance(AudioFormat.MP3, signal, encode_all(AudioFormat.MP3, signal, streaming=False))
    assert default == pytest.approx(distance(DEFAULT_MP3_KBPS))
    assert default < distance(32) - 1.0
    assert default < 2.0


def test_streamed_mp3_comes_from_lameenc_and_a_whole_file_from_pyav() -> None:
    """lameenc is the cheaper LAME (docs/api.md, "MP3 settings"); only PyAV's muxer writes the Xing/LAME
    frame that lets a whole file's decoder trim LAME's delay and padding."""
    streamed = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=True)
    whole = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=False)
    assert isinstance(streamed, LameEncoder)
    assert isinstance(whole, PyAVEncoder)
    signal = make_signal()
    assert b"Info" not in streamed.encode(signal) + streamed.finish()
    assert b"Info" in (whole.encode(signal) + whole.finish())[:2048]  # the tag frame of a CBR file


@pytest.mark.parametrize("kbps", [64, DEFAULT_MP3_KBPS])
def test_streamed_mp3_is_as_faithful_as_the_whole_file(kbps: int) -> None:
    """lameenc's stream and PyAV's file run the same LAME at the same settings: the same distance from the
    source, within 0.1 dB (the bound docs/journal/encoders.md, entry 28, takes as inaudible)."""
    signal = speech_like(3.0, hiss=0.02)

    def distance(streaming: bool) -> float:
        encoder = create_encoder(AudioFormat.MP3, SAMPLE_RATE, streaming=streaming, mp3_kbps=kbps)
        data = b"".join(encoder.encode(piece) for piece in split(signal)) + encoder.finish()
        return mel_distance(AudioFormat.MP3, signal, data, streaming=streaming)

    streamed = distance(streaming=True)
    assert streamed == pytest.approx(distance(streaming=False), abs=0.1)
    assert streamed < 2.0


def test_lameenc_rejects_a_quality_lame_does_not_have() -> None:
    with pytest.raises(ValueError, match="0 to 9"):
        LameEncoder(SAMPLE_RATE, kbps=DEFAULT_MP3_KBPS, quality=-1)
