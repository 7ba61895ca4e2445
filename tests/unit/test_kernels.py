"""The CPU kernels' pieces against PyTorch's own modules: prepared convolutions (weight norm folded, 4-D
channels-last) and the fused AdaIN + activation functions, and the eager fallback when inductor cannot
build."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import weight_norm

from api.engine.compile_cache import source_key
from api.engine.compiled import KernelStores
from api.engine.convolutions import (
    INPUT_LEVELS,
    PAIR_SUM_MAX,
    Conv,
    PolyphaseConv,
    QuantizedConv,
    cpu_int8_dot,
    folded_weight,
    quantize_weight,
)
from api.engine.fused import (
    norm_leaky,
    norm_snake,
    norm_snake_quantized,
    quantize,
    sin_squared,
    step_statistics,
    valid_steps,
)
from api.engine.kernels import (
    PreparedKernels,
    ReleasedModuleError,
    int8_convolutions,
    release_library_convolutions,
)
from api.engine.torch_engine import TorchEngine
from api.server.app import build_engine
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def conv_modules() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        weight_norm(nn.Conv1d(8, 6, 7, padding=9, dilation=3)),
        nn.Conv1d(5, 6, kernel_size=12, stride=6, padding=3),
        weight_norm(nn.ConvTranspose1d(8, 4, 20, 10, padding=5)),
        weight_norm(nn.ConvTranspose1d(8, 8, 3, stride=2, groups=8, padding=1, output_padding=1)),
        weight_norm(nn.Conv1d(8, 4, 1, bias=False)),
    ]


@pytest.mark.parametrize("module", conv_modules(), ids=lambda module: type(module).__name__)
def test_a_prepared_convolution_computes_what_the_module_computes(module: nn.Module) -> None:
    x = torch.randn(1, module.in_channels, 50)
    with torch.no_grad():
        expected = module(x)
        got = Conv.of(module, torch.float32)(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    # The vocoder's convolutions come out channels-last, so the next one needs no reorder (oneDNN's path;
    # depthwise and 1x1 convolutions may take other kernels, and their layout does not matter).
    if module.groups == 1 and module.kernel_size[0] > 1:
        assert got.unsqueeze(2).is_contiguous(memory_format=torch.channels_last)


def test_folded_weight_is_the_weight_norms_weight() -> None:
    module = weight_norm(nn.Conv1d(4, 3, 5))
    with torch.no_grad():
        module(torch.randn(1, 4, 9))  # the hook writes .weight before each forward
        assert torch.equal(folded_weight(module), module.weight)


def adain_inputs(channels: int = 6) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    x = torch.randn(1, channels, 40) * 3 + 1
    h = torch.randn(1, 2 * channels)
    weight, bias = torch.rand(channels) + 0.5, torch.randn(channels) * 0.1
    return x, h, weight, bias


def test_norm_snake_is_the_librarys_adain_and_snake() -> None:
    x, h, weight, bias = adain_inputs()
    alpha = torch.rand(1, 6, 1) + 0.5
    norm = nn.InstanceNorm1d(6, affine=True)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        gamma, beta = h[:, :6, None], h[:, 6:, None]
        y = (1 + gamma) * norm(x) + beta
        expected = y + (1 / alpha) * torch.sin(alpha * y) ** 2
    got = norm_snake(x, None, h, weight, bias, alpha, norm.eps, torch.float32)
    assert torch.allclose(got, expected, atol=1e-5)
    assert norm_snake(x, None, h, weight, bias, alpha, norm.eps, torch.bfloat16).dtype == torch.bfloat16


def test_norm_leaky_is_the_librarys_adain_and_leaky_relu() -> None:
    x, h, weight, bias = adain_inputs()
    norm = nn.InstanceNorm1d(6, affine=True)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        expected = nn.LeakyReLU(0.2)((1 + h[:, :6, None]) * norm(x) + h[:, 6:, None])
    assert torch.allclose(
        norm_leaky(x, None, h, weight, bias, norm.eps, 0.2, torch.float32), expected, atol=1e-5
    )


def test_a_padded_item_gets_what_it_gets_alone() -> None:
    """With a mask, each item's statistics count its own steps only and the result is zero past them."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 30, generator=generator)
    h = torch.randn(2, 8, generator=generator)
    weight, bias = torch.rand(4, generator=generator) + 0.5, torch.randn(4, generator=generator)
    alpha = torch.rand(1, 4, 1, generator=generator) + 0.2
    valid = valid_steps(30, torch.tensor([30, 17]))
    for function, extra in ((norm_snake, (alpha, 1e-5)), (norm_leaky, (1e-5, 0.2))):
        batched = function(x, valid, h, weight, bias, *extra, torch.float32)
        for row, length in enumerate((30, 17)):
            alone = function(
                x[row : row + 1, :, :length], None, h[row : row + 1], weight, bias, *extra, torch.float32
            )
            assert torch.allclose(batched[row, :, :length], alone[0], atol=1e-5), function.__name__
            assert not batched[row, :, length:].any(), function.__name__


def test_without_a_cxx_compiler_the_fused_functions_run_eagerly(tmp_path: Path) -> None:
    """Inductor needs a C++ compiler; where there is none the first call logs a warning and every call
    returns what the plain function returns: compiled just in time, and ahead of time (which tries just in
    time next), where a damaged file in the store of variants is skipped with a warning too."""
    store = tmp_path / "ahead-of-time"
    store.mkdir()
    (store / "norm_snake-damaged.bin").write_bytes(b"not a compiled function")
    program = textwrap.dedent(
        f"""
        import logging, torch
        from pathlib import Path
        from api.engine.compiled import AheadOfTime, Fused
        from api.engine.fused import norm_snake
        logging.basicConfig(level=logging.WARNING)
        x, h = torch.randn(1, 4, 30), torch.randn(1, 8)
        w, b, a = torch.ones(4), torch.zeros(4), torch.full((1, 4, 1), 0.7)
        for store in (None, AheadOfTime(Path({str(store)!r}))):
            fused = Fused(norm_snake, compile=True, store=store)
            for _ in range(2):
                got = fused(x, None, h, w, b, a, 1e-5, torch.float32)
                assert torch.equal(got, norm_snake(x, None, h, w, b, a, 1e-5, torch.float32))
        print("eager fallback ok")
        """
    )
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-compiler"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "eager fallback ok" in done.stdout
    assert done.stderr.count("norm_snake-damaged.bin: skipped") == 1
    assert done.stderr.count("compiling norm_snake ahead of time failed: compiling it just in time") == 1
    assert done.stderr.count("torch.compile failed for norm_snake: running it eagerly") == 2
    assert sorted(path.name for path in store.iterdir()) == ["norm_snake-damaged.bin"]


def cache_dir_at(level: str | None, chosen: Path | None = None) -> str:
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    if level is not None:
        env["ATEN_CPU_CAPABILITY"] = level
    if chosen is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(chosen)
    program = (
        "import os, torch._inductor.config\n"  # inductor writes its default into the variable on import
        "from api.engine.kernels import PreparedKernels\n"
        "PreparedKernels(torch.nn.Sequential(), compile=True)\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_variants_file_is_named_by_what_its_guards_tell_apart() -> None:
    """Workers compiling the same variant at once write one file (the same name); inputs that dynamo's
    guards tell apart get other names."""
    from api.engine.compile_cache import variant_key

    x, h = torch.randn(1, 4, 30), torch.randn(1, 8)
    base = variant_key((x, None, h, 1e-5, torch.float32, 3))
    assert variant_key((torch.randn(1, 6, 90), None, torch.randn(1, 12), 1e-6, torch.float32, 3)) == base
    others = [
        (torch.randn(2, 4, 30), None, h, 1e-5, torch.float32, 3),  # a batch
        (torch.randn(1, 30, 4).transpose(1, 2), None, h, 1e-5, torch.float32, 3),  # channels-last
        (x.bfloat16(), None, h, 1e-5, torch.float32, 3),
        (x, torch.ones(1, 1, 30), h, 1e-5, torch.float32, 3),  # masked
        (x, None, h, 1e-5, torch.bfloat16, 3),
        (x, None, h, 1e-5, torch.float32, 1),  # phases
    ]
    keys = {variant_key(args) for args in others}
    assert len(keys) == len(others)
    assert base not in keys
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert variant_key((x, None, h, 1e-5, torch.float32, 3)) != base
    finally:
        torch.set_num_threads(threads)


def test_each_cpu_dispatch_level_compiles_into_its_own_cache(tmp_path: Path) -> None:
    """Inductor's shared cache mixed kernels across ATEN_CPU_CAPABILITY levels (NaN audio, a corrupted heap):
    each level gets its own directory, unless the user chose one."""
    native, scalar = cache_dir_at(None), cache_dir_at("default")
    assert "kokoro-inductor-" in native
    # and per version of the fused functions' code: a variant compiled ahead of time runs what it was traced
    # from; and per Python version, whose byte code it holds
    source = source_key((ROOT / "api" / "engine" / "fused.py").read_text(encoding="utf-8"))
    assert f"-src{source}-" in native
    assert f"-py{sys.version_info.major}{sys.version_info.minor}-" in native
    assert native != scalar
    assert scalar.endswith("-default-" + scalar.rsplit("-", 1)[1])
    assert cache_dir_at("default", chosen=tmp_path / "mine") == str(tmp_path / "mine")


def test_the_cache_key_follows_the_fused_functions_code_only() -> None:
    """An upgrade that changes no fused function's code keeps the compiled kernels: comments, docstrings and
    layout do not count; any change to what runs does."""
    source = (ROOT / "api" / "engine" / "fused.py").read_text(encoding="utf-8")
    key = source_key(source)
    commented = source.replace("def snake(", "# a comment\n\n\ndef snake(", 1)
    redocumented = source.replace("Snake, y + sin(alpha y)^2 / alpha", "Snake, reworded", 1)
    assert commented != source
    assert redocumented != source
    assert source_key(commented) == key
    assert source_key(redocumented) == key
    changed = source.replace("STATISTICS_BLOCK = 128", "STATISTICS_BLOCK = 64", 1)
    assert changed != source
    assert source_key(changed) != key
    assert source_key(source.replace("1 / alpha", "1.0 / alpha", 1)) != key


def test_the_settings_cache_directory_reaches_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compile_cache_dir` given to the engine (the server passes the setting down) is where the kernels
    compile into, whatever KOKORO_COMPILE_CACHE_DIR says."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("KOKORO_COMPILE_CACHE_DIR", str(tmp_path / "from-the-variable"))
    PreparedKernels(nn.Sequential(), compile=True, cache_root=tmp_path / "given")
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent == tmp_path / "given"
    engine = build_engine(Settings(compile_cache_dir=tmp_path / "from-settings", engine="torch"))
    assert isinstance(engine, TorchEngine)
    assert engine.compile_cache_root == tmp_path / "from-settings"


@pytest.mark.parametrize(("setting", "expected"), [("auto", None), ("true", True), ("false", False)])
def test_the_ahead_of_time_setting_reaches_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, expected: bool | None
) -> None:
    """auto compiles ahead of time on a CPU (and just in time on a GPU), true and false say so anywhere."""
    monkeypatch.setenv("KOKORO_COMPILE_AHEAD_OF_TIME", setting)
    engine = build_engine(Settings(compile_cache_dir=tmp_path, engine="torch"))
    assert isinstance(engine, TorchEngine)
    assert engine.ahead_of_time is expected
    kernels = PreparedKernels(nn.Sequential(), compile=True, cache_root=tmp_path, ahead_of_time=expected)
    on_this_cpu = kernels.ahead_of_time
    assert (on_this_cpu is not None) == (expected is not False)
    if on_this_cpu is not None:
        assert on_this_cpu.directory.parent.parent == tmp_path


def test_engines_built_again_reuse_the_kernels_their_process_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model loaded again after an idle unload gets the store its process loaded the first time, not a
    new one that loads every variant again (torch kept each load's metadata: the worker grew each cycle)."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    stores = KernelStores()
    first, again = (
        PreparedKernels(nn.Sequential(), compile=True, cache_root=tmp_path, ahead_of_time=True, stores=stores)
        for _ in range(2)
    )
    alone = PreparedKernels(nn.Sequential(), compile=True, cache_root=tmp_path, ahead_of_time=True)
    assert first.ahead_of_time is not None
    assert again.ahead_of_time is first.ahead_of_time
    assert alone.ahead_of_time is not first.ahead_of_time
    assert alone.ahead_of_time is not None
    assert alone.ahead_of_time.directory == first.ahead_of_time.directory
    engine = build_engine(Settings(compile_cache_dir=tmp_path, engine="torch"), kernel_stores=stores)
    assert isinstance(engine, TorchEngine)
    assert engine.kernel_stores is stores


def test_released_modules_refuse_to_run() -> None:
    """PreparedKernels keep their own weights; the decoder's modules give theirs up and fail if called."""
    decoder = nn.Sequential(weight_norm(nn.Conv1d(4, 4, 3, padding=1)), nn.Conv1d(4, 2, 1))
    x = torch.randn(1, 4, 10)
    with torch.no_grad():
        expected = decoder(x)
        kernels = PreparedKernels(decoder, compile=False)
        release_library_convolutions(decoder)
        assert torch.allclose(kernels.conv(decoder, x), expected, atol=1e-6)
        assert all(
            parameter.numel() == 0 for name, parameter in decoder.named_parameters() if "bias" not in name
        )
        with pytest.raises(ReleasedModuleError):
            decoder(x)


# --- int8 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phases", [1, 3, 5])
def test_quantize_keeps_zero_exact_and_lays_out_the_phases(phases: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 23)
    x[:, :, 20:] = 0.0  # padding, as in a masked batch
    values, scale, zero_point = quantize(x, phases)
    width = -(-23 // phases)
    assert values.dtype == torch.uint8
    assert values.shape == ((2, 6, 1, 23) if phases == 1 else (2, 6, width, phases))
    assert values.is_contiguous(memory_format=torch.channels_last)
    real = (values.float() - zero_point) * scale  # (B, C, step within a column, column)
    steps = real.reshape(2, 6, width * phases)  # column r holds steps r, r + d, r + 2d, ...
    assert torch.equal(steps[:, :, 20:], torch.zeros_like(steps[:, :, 20:]))  # padding and past the end
    assert float((steps[:, :, :23] - x).abs().max()) <= float(scale) / 2 + 1e-6
    assert float(scale) == pytest.approx(float(x.max() - x.min()) / 255)


# Eager: every phase count, whole and masked. Compiled: one graph of each kind, one phase and whole,
# phased and masked (each compile took 16-48 s of a slower Xeon's unit tests; docs/journal/test-suite.md,
# entry 43).
NORM_SNAKE_CASES = [
    *(
        pytest.param(phases, masked, False, id=f"eager-{'masked' if masked else 'whole'}-{phases}")
        for masked in (False, True)
        for phases in (1, 3, 5)
    ),
    pytest.param(1, False, True, id="compiled-whole-1"),
    pytest.param(3, True, True, id="compiled-masked-3"),
]


@pytest.mark.parametrize(("phases", "masked", "compiled"), NORM_SNAKE_CASES)
def test_norm_snake_quantized_is_quantize_of_norm_snake(phases: int, masked: bool, compiled: bool) -> None:
    """The range it takes from x's extremes is the result's own: the same values, scale and zero point,
    with channels whose AdaIN decreases (a negative norm weight, or 1 + gamma below 0) among them."""
    torch.manual_seed(0)
    channels = 16
    x = (torch.randn(2, 301, channels) * 3 + 0.5).transpose(1, 2)  # channels-last, as the convolutions give
    h = torch.randn(2, 2 * channels)
    h[:, :4] = -3.0  # 1 + gamma < 0 in four channels
    weight, bias = torch.randn(channels), torch.randn(channels) * 0.1
    alpha = torch.rand(1, channels, 1) + 0.3
    valid = valid_steps(301, torch.tensor([301, 220])) if masked else None
    fused = torch.compile(norm_snake_quantized, dynamic=True) if compiled else norm_snake_quantized
    values, scale, zero_point = fused(x, valid, h, weight, bias, alpha, 1e-5, phases)
    expected = quantize(norm_snake(x, valid, h, weight, bias, alpha, 1e-5, torch.float32), phases)
    assert values.shape == expected[0].shape
    assert values.is_contiguous(memory_format=torch.channels_last)
    assert zero_point.dtype == torch.int64
    # Its statistics' sums and its sine differ from torch's in the last bits: a level here and there.
    assert float(scale) == pytest.approx(float(expected[1]), rel=1e-5)
    assert int(zero_point) == int(expected[2])
    differing = values != expected[0]
    assert float(differing.float().mean()) < 1e-3
    assert int((values.int() - expected[0].int()).abs().max()) <= 1


def test_step_statistics_are_those_of_the_valid_steps() -> None:
    torch.manual_seed(0)
    x = (torch.randn(2, 1000, 24) * 3 + 40.0).transpose(1, 2)  # far from 0: the shift must hold
    lengths = torch.tensor([1000, 613])
    valid = valid_steps(1000, lengths)
    mean, variance, low, high = step_statistics(x, valid)
    for row, length in enumerate(lengths.tolist()):
        part = x[row, :, :length].double()
        assert torch.allclose(mean[row, :, 0].double(), part.mean(dim=-1), atol=1e-4)
        assert torch.allclose(variance[row, :, 0].double(), part.var(dim=-1, correction=0), rtol=1e-4)
        assert torch.equal(low[row, :, 0], x[row, :, :length].amin(dim=-1))
        assert torch.equal(high[row, :, 0], x[row, :, :length].amax(dim=-1))
    whole = step_statistics(x, None)
    assert torch.allclose(whole[1][:, :, 0].double(), x.double().var(dim=-1, correction=0), rtol=1e-4)


def test_step_statistics_compile_once_for_chunks_of_any_width() -> None:
    """Under a block's width (six frames of audio at the 256-channel Snake blocks) the steps used to fill
    one block, dynamo guarded on that, and such a chunk compiled a variant of its own under load."""
    from torch._dynamo.utils import counters

    compiled = torch.compile(step_statistics, dynamic=True)
    before = counters["stats"]["unique_graphs"]
    for width in (600, 120, 128, 129, 2, 3000):
        x = torch.randn(1, width, 16).transpose(1, 2)
        mean, variance, low, high = compiled(x, None)
        assert torch.allclose(mean[0, :, 0], x[0].mean(dim=-1), atol=1e-5)
        assert torch.equal(low[0, :, 0], x[0].amin(dim=-1))
    assert counters["stats"]["unique_graphs"] - before == 1


def test_a_variant_whose_key_is_held_already_is_saved_beside_it(tmp_path: Path) -> None:
    """Two variants that one key names (a guard the key does not see tells them apart) both stay on disk,
    and a later start loads both and compiles neither."""
    from api.engine.compile_cache import variant_key, variant_name
    from api.engine.compiled import AheadOfTime

    assert variant_name("k", set()) == "k"
    assert variant_name("k", {"k", "k-1", "other"}) == "k-2"

    def blocks(x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1, 4).sum(dim=1)

    one, ten = torch.randn(2, 4), torch.randn(2, 40)  # one block, ten blocks: a guard on the count
    assert variant_key((one,)) == variant_key((ten,))
    store = AheadOfTime(tmp_path)
    for x in (one, ten):
        assert torch.allclose(store.run(blocks, (x,)), blocks(x))
    assert store.built == 2
    assert len(list(tmp_path.glob("blocks-*.bin"))) == 2
    again = AheadOfTime(tmp_path)
    for x in (one, ten):
        assert torch.allclose(again.run(blocks, (x,)), blocks(x))
    assert (again.loaded, again.built) == (2, 0)


def test_sin_squared_is_within_5e7_of_torch_and_the_arguments_rounding_beyond() -> None:
    small = torch.linspace(-4.0, 4.0, 100_001)
    assert float((sin_squared(small) - torch.sin(small).square()).abs().max()) < 5e-7
    large = torch.linspace(-200.0, 200.0, 2_000_001)  # v / pi rounds to 4e-6 there
    assert float((sin_squared(large) - torch.sin(large).square()).abs().max()) < 2e-5


INT8_CONV_CASES = [(3, 1, 50), (11, 1, 64), (7, 3, 50), (3, 5, 49)]


def int8_case(kernel: int, dilation: int, width: int) -> tuple[nn.Module, Tensor]:
    """A weight-normed Conv1d of 32 to 24 channels and an input for it, as the int8 tests take them."""
    torch.manual_seed(0)
    module = weight_norm(nn.Conv1d(32, 24, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2))
    return module, torch.randn(1, 32, width)


def pair_sums(values: Tensor, levels: Tensor, dilation: int, padding: int) -> tuple[Tensor, Tensor]:
    """A model of the sums oneDNN's int8 convolution forms before its zero point and scales are applied, for
    uint8 inputs `values` (B, C, T) and int8 weights `levels` (O, C, K): each output's sum of products
    exactly, as int8 dot products (VNNI, AMX) form it in 32 bits, and as AVX2's kernels form it without them:
    vpmaddubsw adds the products of two adjacent input channels at one tap into a signed 16-bit integer that
    saturates, and those pairs are summed in 32 bits. float64 holds every such sum exactly."""
    steps = F.pad(values.double(), (padding, padding))
    width, kernel = values.shape[-1], levels.shape[-1]
    taps = torch.stack([steps[:, :, k * dilation : k * dilation + width] for k in range(kernel)], dim=2)
    products = taps[:, None] * levels.double()[None, :, :, :, None]  # (B, O, C, K, T)
    pairs = products[:, :, 0::2] + products[:, :, 1::2]
    saturated = pairs.clamp(-PAIR_SUM_MAX - 1, PAIR_SUM_MAX)
    return pairs.sum(dim=(2, 3)), saturated.sum(dim=(2, 3))


def dequantized(sums: Tensor, x: Tensor, module: nn.Module, levels: Tensor, scales: Tensor) -> Tensor:
    """The convolution's float result from the `pair_sums` of x's `quantize` and of `levels` with their
    `scales`: less the zero point times the weights the valid steps meet, scaled, with the bias."""
    _, scale, zero_point = quantize(x, 1)
    inside = F.conv1d(
        torch.ones_like(x, dtype=torch.float64),
        levels.double(),
        padding=module.padding,
        dilation=module.dilation,
    )
    real = (sums - float(zero_point) * inside) * float(scale) * scales.double()[None, :, None]
    return (real + module.bias.double()[None, :, None]).float()


def int8_inputs_and_weights(module: nn.Module, x: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """x's uint8 values (B, C, T) as `quantize` gives them, the module's int8 weight (O, C, K) and scales."""
    values, _, _ = quantize(x, 1)
    weight, scales = quantize_weight(folded_weight(module).detach().float(), levels)
    return values[:, :, 0, :], weight, scales


def relative_error(got: Tensor, expected: Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm())


@pytest.mark.numerics
@pytest.mark.parametrize(("kernel", "dilation", "width"), INT8_CONV_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("phased", [True, False])
def test_an_int8_convolution_computes_what_the_module_computes_within_int8_rounding(
    kernel: int, dilation: int, width: int, dtype: torch.dtype, phased: bool
) -> None:
    """On this CPU's kernels, with the weights' levels the engine takes here (`cpu_int8_dot`)."""
    module, x = int8_case(kernel, dilation, width)
    with torch.no_grad():
        expected = module(x)
        got = QuantizedConv(Conv.of(module, dtype), dtype, phased=phased)(x)
    assert got.shape == expected.shape
    assert got.dtype == dtype
    assert got.unsqueeze(2).is_contiguous(memory_format=torch.channels_last)
    # 8 bits for the input over its range and per output channel for the weight: about 1% of the signal
    # (2.8e-3 for bf16 alone); a wrong phase or tap would be of the signal's own size.
    relative = relative_error(got, expected)
    assert relative < 0.03, relative


# The weights' largest level and an input whose every value is 0 or 255: the largest sums there are.
ADVERSARIAL = "adversarial"


@pytest.mark.numerics
@pytest.mark.parametrize(("kernel", "dilation", "width"), INT8_CONV_CASES)
@pytest.mark.parametrize("inputs", ["random", ADVERSARIAL])
def test_without_int8_dot_products_no_pair_of_products_can_saturate(
    kernel: int, dilation: int, width: int, inputs: str
) -> None:
    """The weights the engine takes where the CPU has no int8 dot products (AVX2): no pair of products
    reaches 16 bits, so the pair sums AVX2 forms are the exact ones, and oneDNN's result on whatever kernel
    this CPU runs is the exact sums' (on an AVX-512 machine the numerics rerun caps oneDNN at AVX2, whose
    kernel saturates as the model says: the next test)."""
    module, x = int8_case(kernel, dilation, width)
    if inputs == ADVERSARIAL:
        x = torch.where(torch.rand_like(x) < 0.5, -1.0, 1.0)  # uint8 0 and 255
        with torch.no_grad():
            module.weight_v.fill_(1.0)  # every tap at its channel's largest level
    conv = QuantizedConv(Conv.of(module, torch.float32), torch.float32, phased=False, int8_dot=False)
    values, weight, scales = int8_inputs_and_weights(module, x, conv.weight_levels)
    assert torch.equal(scales, conv.scales)
    assert 2 * INPUT_LEVELS * int(weight.abs().max()) <= PAIR_SUM_MAX
    exact, saturated = pair_sums(values, weight.squeeze(2), dilation, module.padding[0])
    assert torch.equal(exact, saturated)
    with torch.no_grad():
        expected = module(x)
        got = conv(x)
    assert torch.allclose(got, dequantized(exact, x, module, weight.squeeze(2), scales), rtol=1e-5, atol=1e-4)
    assert relative_error(got, expected) < 0.03


@pytest.mark.numerics
@pytest.mark.parametrize(("kernel", "dilation", "width"), INT8_CONV_CASES)
def test_the_pair_sum_model_sees_8_bit_weights_saturate_and_is_the_kernels_own(
    kernel: int, dilation: int, width: int
) -> None:
    """With 127 levels a sign (right where the CPU has int8 dot products) the model's 16-bit pair sums
    saturate on these convolutions and put them out of tolerance, so the test above can fail; and oneDNN's
    own result is the model's: its saturated sums where this CPU's int8 kernels (as capped) have no dot
    products, the exact sums where they do."""
    module, x = int8_case(kernel, dilation, width)
    conv = QuantizedConv(Conv.of(module, torch.float32), torch.float32, phased=False, int8_dot=True)
    values, weight, scales = int8_inputs_and_weights(module, x, conv.weight_levels)
    exact, saturated = pair_sums(values, weight.squeeze(2), dilation, module.padding[0])
    with torch.no_grad():
        expected = module(x)
        got = conv(x)
    as_avx2 = dequantized(saturated, x, module, weight.squeeze(2), scales)
    assert relative_error(as_avx2, expected) > 0.05
    assert relative_error(dequantized(exact, x, module, weight.squeeze(2), scales), expected) < 0.03
    kernels = exact if cpu_int8_dot() else saturated
    model = dequantized(kernels, x, module, weight.squeeze(2), scales)
    assert torch.allclose(got, model, rtol=1e-5, atol=1e-4), float((got - model).abs().max())


@pytest.mark.parametrize(("kernel", "dilation"), [(7, 3), (11, 5)])
def test_a_dilated_int8_convolution_gives_the_same_values_in_phases_or_dilated_by_onednn(
    kernel: int, dilation: int
) -> None:
    torch.manual_seed(0)
    module = weight_norm(nn.Conv1d(48, 48, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2))
    conv = Conv.of(module, torch.float32)
    x = torch.randn(2, 48, 301)
    with torch.no_grad():
        phased = QuantizedConv(conv, torch.float32, phased=True)
        dilated = QuantizedConv(conv, torch.float32, phased=False)
        assert (phased.phases, dilated.phases) == (dilation, 1)
        # the same int32 sums of the same quantized values, scaled the same way
        assert torch.allclose(phased(x), dilated(x), rtol=0, atol=1e-5)


@pytest.mark.numerics
def test_int8_kernels_take_the_snake_blocks_convolutions_and_stay_near_float(random_weights: Path) -> None:
    import json

    from api.engine.torch_engine import load_kmodel

    config = json.loads((random_weights / "config.json").read_text())
    model = load_kmodel(config, random_weights / "kokoro-v1_0.pth")
    decoder = model.decoder
    generator = decoder.generator
    taken = {id(module) for module in int8_convolutions(decoder)}
    blocks = [*generator.resblocks, *generator.noise_res]
    assert taken == {id(conv) for block in blocks for conv in [*block.convs1, *block.convs2]}
    float_kernels = PreparedKernels(decoder, compile=False)
    int8_kernels = PreparedKernels(decoder, compile=False, int8=True)
    block = generator.resblocks[1]  # kernel 7, dilations 1, 3, 5
    torch.manual_seed(1)
    x = torch.randn(1, block.convs1[0].in_channels, 300)
    style = torch.randn(1, 128)
    with torch.no_grad():
        expected = float_kernels.res_block1(block, x, style, None)
        got = int8_kernels.res_block1(block, x, style, None)
    relative = float((got - expected).norm() / expected.norm())
    assert 0 < relative < 0.05, relative


@pytest.mark.parametrize(("stride", "kernel", "padding"), [(10, 20, 5), (6, 12, 3), (2, 4, 1), (3, 3, 0)])
def test_a_polyphase_convolution_is_the_transposed_one(stride: int, kernel: int, padding: int) -> None:
    torch.manual_seed(0)
    module = weight_norm(nn.ConvTranspose1d(24, 16, kernel, stride, padding=padding))
    x = torch.randn(2, 24, 37)
    with torch.no_grad():
        expected = module(x)
        conv = Conv.of(module, torch.float32)
        assert PolyphaseConv.applies(conv)
        got = PolyphaseConv(conv)(x)
    assert got.shape == expected.shape == (2, 16, 37 * stride)
    assert got.unsqueeze(2).is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(got, expected, atol=1e-5), float((got - expected).abs().max())


def test_the_decoder_upsamplers_run_polyphase_on_a_cpu(random_weights: Path) -> None:
    import json

    from api.engine.torch_engine import load_kmodel

    config = json.loads((random_weights / "config.json").read_text())
    decoder = load_kmodel(config, random_weights / "kokoro-v1_0.pth").decoder
    kernels = PreparedKernels(decoder, compile=False)
    for up in decoder.generator.ups:
        assert isinstance(kernels._convs[id(up)], PolyphaseConv)
    pools = [block.pool for block in decoder.decode if block.upsample_type != "none"]
    assert pools
    assert all(isinstance(kernels._convs[id(pool)], Conv) for pool in pools)  # depthwise: as it was


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="oneDNN's int8 kernels: x86 only")
@pytest.mark.parametrize(("isa_cap", "phased"), [("AVX2", False), ("", None)])
def test_the_int8_engine_dilates_in_phases_only_with_int8_dot_products(
    random_weights: Path, monkeypatch: pytest.MonkeyPatch, isa_cap: str, phased: bool | None
) -> None:
    from api.engine.choice import cpu_flags, int8_dot
    from api.engine.torch_engine import TorchEngine

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa_cap)
    if phased is None:  # this CPU's own kernels
        phased = bool(int8_dot(cpu_flags(), None))
    engine = TorchEngine(
        random_weights, device="cpu", threads=1, precision="int8", compile=False, warmup=False
    )
    engine.load()
    kernels = engine._kernels
    assert kernels is not None
    quantized = [conv for conv in kernels._convs.values() if isinstance(conv, QuantizedConv)]
    dilated = [conv for conv in quantized if conv.phases > 1 or conv.dilation[1] > 1]
    assert dilated
    assert all((conv.phases > 1) == phased and (conv.dilation[1] > 1) != phased for conv in dilated)


def test_folding_weight_norms_keeps_the_audio_bit_for_bit(random_weights: Path) -> None:
    import json

    from torch.nn.utils.weight_norm import WeightNorm

    from api.engine.batched import forward_batch, make_batch
    from api.engine.kernels import fold_weight_norms
    from api.engine.torch_engine import load_kmodel

    model = load_kmodel(
        json.loads((random_weights / "config.json").read_text()), random_weights / "kokoro-v1_0.pth"
    )
    torch.manual_seed(0)
    tokens, style = list(range(10, 40)), torch.randn(256)

    def audio() -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(1)  # the forward draws from torch's global generator too
        return forward_batch(model, make_batch([tokens], [style], [1.0], [generator], "cpu")).audio[0]

    before = audio()
    assert fold_weight_norms(model) > 0
    assert not any(
        isinstance(hook, WeightNorm) for m in model.modules() for hook in m._forward_pre_hooks.values()
    )
    assert torch.equal(audio(), before)


def test_an_arm_cpu_runs_the_library_modules_and_says_why(
    random_weights: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On ARM the prepared kernels (oneDNN's x86 paths, never measured there) are not built: kokoro's own
    modules run, and the log says so."""
    import numpy as np

    from api.engine import torch_engine
    from api.engine.base import SynthesisItem

    graviton = frozenset({"fp", "asimd", "asimddp", "i8mm", "bf16", "sve"})
    monkeypatch.setattr(torch_engine, "cpu_flags", lambda: graviton)
    engine = TorchEngine(
        random_weights, device="cpu", threads=1, precision="fp32", compile=False, warmup=False
    )
    with caplog.at_level("INFO", logger="api.engine.torch_engine"):
        engine.load()
    assert engine._kernels is None
    assert "prepared kernels not used: CPU (arm64: asimd asimddp i8mm bf16 sve)" in caplog.text
    (audio,) = engine.synthesize(
        [SynthesisItem(tokens=(50, 83, 156, 54), style=np.zeros(256, np.float32), speed=1.0)]
    )
    assert len(audio.samples) > 0


def test_a_compile_request_keeps_its_arguments_as_the_guards_see_them(tmp_path: Path) -> None:
    """The background compiler gets copies with the calls' own sizes, strides and offsets, views where they
    were views (of a base of the same shape) and none where they were not, inference tensors where they
    were: dynamo's guards read all of it, and a variant compiled for copies that differed never took the
    calls that asked for it (they ran eagerly for good)."""
    from api.engine.compile_requests import portable, rebuilt

    parameter = nn.Parameter(torch.randn(4))
    base = torch.randn(2, 6, 50)
    with torch.inference_mode():
        made_in_inference = [torch.randn(2, 6, 50)[..., 3:40], torch.randn(3, 1, 7), parameter.detach()]
    tensors = [base[..., 3:40], base.transpose(1, 2), base[:, ::2], base[1:], base, *made_in_inference]
    for index, tensor in enumerate(tensors):
        path = tmp_path / f"{index}.pt"
        torch.save(portable(tensor), path)  # as a request travels
        copy = rebuilt(torch.load(path, weights_only=True))
        assert copy.shape == tensor.shape
        assert copy.stride() == tensor.stride()
        assert copy.storage_offset() == tensor.storage_offset()
        assert copy.is_inference() == tensor.is_inference()
        assert (copy._base is None) == (tensor._base is None)
        if tensor._base is not None:
            assert copy._base.shape == tensor._base.shape
        assert torch.equal(copy, tensor)
        assert copy.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    assert rebuilt(portable(None)) is None
    assert rebuilt(portable(1e-5)) == 1e-5
