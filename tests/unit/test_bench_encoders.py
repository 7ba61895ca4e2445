"""scripts/bench/encoders.py: its options build the server's encoders; its distance sees what a codec
did."""

from __future__ import annotations

import numpy as np
import pytest

from api.audio.encoder import CODEC_SPECS, LameEncoder, create_encoder
from api.audio.formats import AudioFormat
from scripts.bench import encoders as bench

RATE = bench.SAMPLE_RATE


def test_every_lossy_format_has_its_server_default_among_the_options() -> None:
    assert set(bench.DEFAULTS) == {AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC}
    for fmt, option in bench.DEFAULTS.items():
        assert option.spec() == CODEC_SPECS[fmt]


def test_an_option_overrides_only_what_it_names() -> None:
    option = bench.Option("aac 64k", AudioFormat.AAC, 64_000, {"profile": "aac_low"})
    spec = option.spec()
    assert spec.bit_rate == 64_000
    assert spec.codec_options == {**CODEC_SPECS[AudioFormat.AAC].codec_options, "profile": "aac_low"}
    assert spec.container == CODEC_SPECS[AudioFormat.AAC].container


def streamed_by_the_server(source: np.ndarray, **mp3: int) -> bytes:
    encoder = create_encoder(AudioFormat.MP3, RATE, streaming=True, **mp3)
    return encoder.encode(source) + encoder.finish()


def test_the_lameenc_option_at_the_server_settings_is_the_servers_streamed_mp3() -> None:
    """Byte for byte: the benchmark measures what the server streams."""
    source = bench.speech_like(2.0)
    made = bench.encode(bench.LAMEENC[0], source, piece_s=10.0, streaming=True)
    assert made == streamed_by_the_server(source)


def test_a_lameenc_option_takes_its_bit_rate_and_quality() -> None:
    source = bench.speech_like(2.0)
    option = bench.Option("x", AudioFormat.MP3, 32_000, {"compression_level": "3"}, library="lameenc")
    assert isinstance(option.encoder(streaming=True), LameEncoder)
    made = bench.encode(option, source, piece_s=10.0, streaming=True)
    assert made == streamed_by_the_server(source, mp3_kbps=32, mp3_quality=3)
    assert made != streamed_by_the_server(source)


def test_alignment_finds_the_codec_delay() -> None:
    source = bench.speech_like(2.0)
    delayed = np.concatenate([np.zeros(1105, np.float32), source, np.zeros(500, np.float32)])
    np.testing.assert_array_equal(bench.aligned(source, delayed), source)


@pytest.mark.parametrize("fmt", [AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC])
def test_a_decoded_encoding_is_near_its_source_and_a_worse_one_is_further(fmt: AudioFormat) -> None:
    source = bench.speech_like(2.0)
    decoded = bench.aligned(source, bench.decode(bench.encode(bench.DEFAULTS[fmt], source, streaming=False)))
    ours = bench.distance_db(source, decoded)
    assert ours < 8.0
    # The same audio through a 4 kHz low-pass is what a worse encoder would give: it must read as further.
    spectrum = np.fft.rfft(source)
    spectrum[np.fft.rfftfreq(len(source), 1 / RATE) > 4000] = 0
    assert bench.distance_db(source, np.fft.irfft(spectrum, len(source))) > ours + 1.0


def test_the_summary_joins_speed_and_fidelity_by_option() -> None:
    report = {
        "speed": {"options": {"a": {"audio_s_per_cpu_s": 50.0}, "b": {"audio_s_per_cpu_s": 70.0}}},
        "fidelity": {"b": {"mel_db": 1.5}, "c": {"mel_db": 0.5}},
    }
    assert bench.summary(report) == [
        {"option": "a", "audio_s_per_cpu_s": 50.0},
        {"option": "b", "audio_s_per_cpu_s": 70.0, "mel_db": 1.5},
        {"option": "c", "mel_db": 0.5},
    ]
