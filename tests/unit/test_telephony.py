"""api/audio/telephony.py: raw 16-bit PCM, μ-law and A-law at the voice-agent protocols' rates, resampled
with a filter (a tone keeps its pitch and level, nothing folds down), decoded back with PyAV."""

from __future__ import annotations

import av
import numpy as np
import pytest

from api.audio.telephony import RawEncoder, RawEncoding

SOURCE_RATE = 24000


def tone(frequency: float, seconds: float = 1.0, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(SOURCE_RATE * seconds)) / SOURCE_RATE
    return (level * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def encode(encoder: RawEncoder, samples: np.ndarray, piece: int = 2400) -> bytes:
    return b"".join(encoder.encode(samples[i : i + piece]) for i in range(0, len(samples), piece)) + (
        encoder.finish()
    )


def decode(data: bytes, encoding: RawEncoding, rate: int) -> np.ndarray:
    if encoding is RawEncoding.LINEAR16:
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
    codec = av.CodecContext.create({"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}[encoding.value], "r")
    assert isinstance(codec, av.AudioCodecContext)
    codec.sample_rate = rate
    codec.layout = "mono"
    frames = codec.decode(av.Packet(data))
    return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames]).astype(np.float32) / 32768


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize(
    ("encoding", "rate"),
    [
        (RawEncoding.LINEAR16, 24000),
        (RawEncoding.LINEAR16, 16000),
        (RawEncoding.LINEAR16, 22050),
        (RawEncoding.LINEAR16, 44100),
        (RawEncoding.LINEAR16, 8000),
        (RawEncoding.MULAW, 8000),
        (RawEncoding.ALAW, 8000),
        (RawEncoding.MULAW, 16000),
    ],
)
def test_a_tone_keeps_its_length_pitch_and_level(encoding: RawEncoding, rate: int) -> None:
    data = encode(RawEncoder(encoding, rate, SOURCE_RATE), tone(440))
    decoded = decode(data, encoding, rate)
    assert len(decoded) == rate  # one second, every sample: the resampler's tail is drained
    assert peak_hz(decoded, rate) == pytest.approx(440, abs=2)
    middle = decoded[rate // 10 : -rate // 10]
    assert np.max(np.abs(middle)) == pytest.approx(0.5, abs=0.03)


def test_above_the_new_nyquist_is_filtered_not_folded() -> None:
    """5 kHz cannot exist at 8 kHz: a filter removes it; dropping samples would fold it down to 3 kHz."""
    decoded = decode(
        encode(RawEncoder(RawEncoding.LINEAR16, 8000, SOURCE_RATE), tone(5000)), RawEncoding.LINEAR16, 8000
    )
    assert np.sqrt(np.mean(decoded[800:-800] ** 2)) < 0.01


def test_pieces_join_as_one_stream() -> None:
    samples = tone(300) + tone(1200, level=0.2)
    whole = encode(RawEncoder(RawEncoding.LINEAR16, 16000, SOURCE_RATE), samples, piece=len(samples))
    pieces = encode(RawEncoder(RawEncoding.LINEAR16, 16000, SOURCE_RATE), samples, piece=977)
    difference = decode(whole, RawEncoding.LINEAR16, 16000) - decode(pieces, RawEncoding.LINEAR16, 16000)
    assert np.max(np.abs(difference)) <= 2 / 32768


def test_the_model_rate_as_linear16_is_the_pcm_response() -> None:
    samples = tone(200)
    data = encode(RawEncoder(RawEncoding.LINEAR16, SOURCE_RATE, SOURCE_RATE), samples)
    assert data == np.round(samples * 32767).astype("<i2").tobytes()
