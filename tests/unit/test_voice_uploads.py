"""Custom voices over the HTTP layer (fake engine): uploads and their refusals, named mixes, deletion, .pt
downloads and Kokoro-FastAPI's combine, keys and the uploads switch, concurrent uploads of one name."""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as save_safetensors

from api.engine.voice_files import MAX_VOICE_FILE_BYTES
from api.server.app import create_app
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.conftest import StartClient
from tests.unit.test_api import make_settings

MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(tmp_path: Path, start_client: StartClient) -> MakeClient:
    def make(**overrides: object) -> TestClient:
        overrides.setdefault("custom_voices_dir", tmp_path / "custom")
        settings = make_settings(tmp_path, **overrides)
        return start_client(create_app(settings, engine=FakeEngine(), phonemizer=FakePhonemizer()))  # type: ignore[arg-type]

    return make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    return make_client()


def pt_bytes(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def a_pack(value: float = 0.5) -> torch.Tensor:
    return torch.linspace(-value, value, 510 * 256).reshape(510, 1, 256)


def upload(client: TestClient, name: str, data: bytes, filename: str = "voice.pt", **headers: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/audio/voices", data={"name": name}, files={"file": (filename, data)}, headers=headers
    )


def error_code(response) -> str:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["code"])


def download(client: TestClient, spec: str) -> torch.Tensor:
    response = client.get(f"/v1/audio/voices/{spec}")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"].endswith('.pt"')
    tensor: torch.Tensor = torch.load(io.BytesIO(response.content), weights_only=True)
    return tensor


def test_an_upload_is_listed_served_and_downloaded_bit_for_bit(client: TestClient, tmp_path: Path) -> None:
    pack = a_pack()
    response = upload(client, "af_narrator", pt_bytes(pack))
    assert response.status_code == 201, response.text
    assert response.json()["id"] == "af_narrator"
    assert response.json()["gender"] == "female"
    assert "af_narrator" in [voice["id"] for voice in client.get("/v1/audio/voices").json()["voices"]]
    assert torch.equal(download(client, "af_narrator"), pack)
    assert (tmp_path / "custom" / "af_narrator.pt").is_file()
    speech = client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": "af_narrator"})
    assert speech.status_code == 200
    assert speech.content


@pytest.mark.parametrize(
    "packed",
    [
        pytest.param(lambda t: pt_bytes(t.reshape(510, 256)), id="pt-510x256"),
        pytest.param(lambda t: pt_bytes({"voice": t}), id="pt-dict-of-one"),
        pytest.param(lambda t: save_safetensors({"voice": t.contiguous()}), id="safetensors"),
    ],
)
def test_the_other_accepted_forms_store_the_same_pack(
    client: TestClient, packed: Callable[[torch.Tensor], bytes]
) -> None:
    pack = a_pack(0.25)
    assert upload(client, "bm_other", packed(pack), filename="x.bin").status_code == 201
    assert torch.equal(download(client, "bm_other"), pack)


def _unsafe_pickle() -> bytes:
    # A pickle whose loading would call a function: the weights-only loader must refuse it, not run it.
    return pickle.dumps(threading.Thread)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (pt_bytes(torch.zeros(510, 1, 128)), "invalid_voice_shape"),
        (pt_bytes(torch.zeros(511, 256)), "invalid_voice_shape"),
        (pt_bytes(torch.zeros(510, 1, 256, dtype=torch.float16)), "invalid_voice_dtype"),
        (pt_bytes(torch.zeros(510, 1, 256, dtype=torch.int32)), "invalid_voice_dtype"),
        (pt_bytes(torch.zeros(510, 1, 256, dtype=torch.bfloat16)), "invalid_voice_dtype"),
        (pt_bytes(torch.full((510, 1, 256), float("nan"))), "invalid_voice_values"),
        (pt_bytes(a_pack().index_fill(0, torch.tensor([7]), float("inf"))), "invalid_voice_values"),
        (pt_bytes({"a": torch.zeros(510, 1, 256), "b": torch.zeros(2)}), "invalid_voice_file"),
        (pt_bytes([a_pack()]), "invalid_voice_file"),
        (save_safetensors({"a": torch.zeros(510, 1, 256), "b": torch.zeros(2)}), "invalid_voice_file"),
        (_unsafe_pickle(), "invalid_voice_file"),
        (b"not a tensor at all", "invalid_voice_file"),
        (pt_bytes(torch.zeros(MAX_VOICE_FILE_BYTES // 4 + 1)), "file_too_large"),
        (b"\0" * (MAX_VOICE_FILE_BYTES + 64 * 1024), "file_too_large"),
    ],
    ids=[
        "shape-128",
        "shape-511",
        "float16",
        "int32",
        "bfloat16",
        "nan",
        "inf",
        "dict-of-two",
        "list",
        "safetensors-of-two",
        "unsafe-pickle",
        "garbage",
        "too-large-tensor",
        "too-large-body",
    ],
)
def test_bad_files_get_400_and_change_nothing(
    client: TestClient, tmp_path: Path, data: bytes, code: str
) -> None:
    response = upload(client, "af_bad", data)
    assert response.status_code == 400, response.text
    assert error_code(response) == code
    assert not (tmp_path / "custom").exists() or not list((tmp_path / "custom").iterdir())
    assert client.get("/v1/audio/voices/af_bad").status_code == 400


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("narrator", "invalid_voice_name"),
        ("af_", "invalid_voice_name"),
        ("xf_narrator", "invalid_voice_name"),
        ("ax_narrator", "invalid_voice_name"),
        ("af_../../etc", "invalid_voice_name"),
        ("af_a+b", "invalid_voice_name"),
        ("af_heart", "voice_name_taken"),
        ("af_bella", "voice_name_taken"),
    ],
)
def test_bad_names_get_400_and_change_nothing(
    client: TestClient, tmp_path: Path, name: str, code: str
) -> None:
    response = upload(client, name, pt_bytes(a_pack()))
    assert response.status_code == 400
    assert error_code(response) == code
    assert not (tmp_path / "custom").exists() or not list((tmp_path / "custom").iterdir())
    assert torch.equal(download(client, "af_heart"), torch.full((510, 1, 256), 0.1))


def test_a_form_needs_a_file_or_a_voice_and_multipart(client: TestClient) -> None:
    neither = client.post("/v1/audio/voices", data={"name": "af_x1"}, files={"other": ("x", b"1")})
    assert neither.status_code == 400
    assert error_code(neither) == "invalid_form"
    both = client.post(
        "/v1/audio/voices",
        data={"name": "af_x1", "voice": "af_bella"},
        files={"file": ("x.pt", pt_bytes(a_pack()))},
    )
    assert both.status_code == 400
    assert error_code(both) == "invalid_form"
    plain = client.post("/v1/audio/voices", content=b"af_x1", headers={"Content-Type": "text/plain"})
    assert plain.status_code == 400
    assert error_code(plain) == "invalid_content_type"
    json_body = client.post("/v1/audio/voices", json={"name": "af_x1", "voice": "af_bella"})
    assert json_body.status_code == 400
    assert error_code(json_body) == "invalid_content_type"


def test_a_named_mix_is_saved_as_its_pack_now(client: TestClient) -> None:
    expected = download(client, "af_bella(2)+af_sky(1)")
    saved = client.post("/v1/audio/voices", data={"name": "af_blend", "voice": "af_bella(2)+af_sky(1)"})
    assert saved.status_code == 201, saved.text
    assert torch.equal(download(client, "af_blend"), expected)
    assert np.allclose(expected.numpy(), (2 * 0.2 + 0.3) / 3)
    unknown = client.post("/v1/audio/voices", data={"name": "af_blend", "voice": "af_nobody"})
    assert unknown.status_code == 400
    assert error_code(unknown) == "voice_not_found"
    assert torch.equal(download(client, "af_blend"), expected)  # the failed save changed nothing


def test_a_custom_voice_mixes_with_built_in_ones(client: TestClient) -> None:
    upload(client, "af_custom", pt_bytes(torch.full((510, 1, 256), 0.9)))
    assert np.allclose(download(client, "af_custom+af_heart").numpy(), (0.9 + 0.1) / 2)


def test_a_replaced_voice_is_served_new_even_inside_cached_mixes(client: TestClient) -> None:
    upload(client, "af_custom", pt_bytes(torch.full((510, 1, 256), 0.9)))
    assert np.allclose(download(client, "af_custom+af_heart").numpy(), 0.5)
    upload(client, "af_custom", pt_bytes(torch.full((510, 1, 256), 0.3)))
    assert np.allclose(download(client, "af_custom+af_heart").numpy(), 0.2)


def test_delete_removes_an_upload_and_refuses_built_in_and_unknown_ones(client: TestClient) -> None:
    upload(client, "af_gone", pt_bytes(a_pack()))
    assert np.allclose(download(client, "af_gone+af_heart").numpy().mean(), 0.05, atol=1e-6)
    deleted = client.delete("/v1/audio/voices/af_gone")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": "af_gone", "object": "voice", "deleted": True}
    assert error_code(client.get("/v1/audio/voices/af_gone+af_heart")) == "voice_not_found"
    speech = client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "af_gone"})
    assert speech.status_code == 400
    builtin = client.delete("/v1/audio/voices/af_heart")
    assert builtin.status_code == 400
    assert error_code(builtin) == "builtin_voice"
    alias = client.delete("/v1/audio/voices/alloy")
    assert alias.status_code == 400
    assert error_code(alias) == "builtin_voice"
    assert client.delete("/v1/audio/voices/af_gone").status_code == 404
    assert client.delete("/v1/audio/voices/..").status_code == 404


@pytest.mark.parametrize("body", ["af_bella+af_sky", ["af_bella", "af_sky"], "af_bella(1)+af_sky(1)"])
def test_combine_answers_kokoro_fastapi_style_with_a_pt_file(client: TestClient, body: object) -> None:
    response = client.post("/v1/audio/voices/combine", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert "attachment; filename=" in response.headers["content-disposition"]
    tensor = torch.load(io.BytesIO(response.content), weights_only=True)
    assert tensor.shape == (510, 1, 256)
    assert tensor.dtype == torch.float32
    assert torch.allclose(tensor, torch.full((510, 1, 256), 0.25))


@pytest.mark.parametrize("body", [[], "", "af_nobody+af_sky", {"voices": "af_bella"}])
def test_combine_refuses_what_names_no_voice(client: TestClient, body: object) -> None:
    response = client.post("/v1/audio/voices/combine", json=body)
    assert response.status_code == 400
    error_code(response)


def test_uploads_off_refuses_adding_and_deleting_but_serves_what_is_there(
    make_client: MakeClient, tmp_path: Path
) -> None:
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "af_kept.pt").write_bytes(pt_bytes(a_pack()))
    client = make_client(voice_uploads=False)
    refused = upload(client, "af_new", pt_bytes(a_pack()))
    assert refused.status_code == 403
    assert error_code(refused) == "voice_uploads_disabled"
    mix = client.post("/v1/audio/voices", data={"name": "af_new", "voice": "af_bella"})
    assert mix.status_code == 403
    assert client.delete("/v1/audio/voices/af_kept").status_code == 403
    assert torch.equal(download(client, "af_kept"), a_pack())
    assert not (tmp_path / "custom" / "af_new.pt").exists()


def test_no_custom_directory_means_no_uploads(make_client: MakeClient) -> None:
    client = make_client(custom_voices_dir=None)
    assert upload(client, "af_new", pt_bytes(a_pack())).status_code == 403


def test_with_api_keys_uploads_deletes_and_downloads_need_a_key(make_client: MakeClient) -> None:
    client = make_client(api_keys="alice:sk-alice-123")
    assert upload(client, "af_keyed", pt_bytes(a_pack())).status_code == 401
    assert client.delete("/v1/audio/voices/af_keyed").status_code == 401
    assert client.post("/v1/audio/voices/combine", json="af_bella").status_code == 401
    assert client.get("/v1/audio/voices/af_bella").status_code == 401
    keyed = upload(client, "af_keyed", pt_bytes(a_pack()), Authorization="Bearer sk-alice-123")
    assert keyed.status_code == 201
    removed = client.delete("/v1/audio/voices/af_keyed", headers={"Authorization": "Bearer sk-alice-123"})
    assert removed.status_code == 200


def test_concurrent_uploads_of_one_name_leave_one_whole_file(client: TestClient, tmp_path: Path) -> None:
    packs = [torch.full((510, 1, 256), 0.01 * (i + 1)) for i in range(8)]
    statuses: list[int] = []

    def send(pack: torch.Tensor) -> None:
        statuses.append(upload(client, "af_race", pt_bytes(pack)).status_code)

    threads = [threading.Thread(target=send, args=(pack,)) for pack in packs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [201] * len(packs)
    assert [path.name for path in (tmp_path / "custom").iterdir()] == ["af_race.pt"]  # no temporary left
    stored = torch.load(tmp_path / "custom" / "af_race.pt", weights_only=True)
    assert any(torch.equal(stored, pack) for pack in packs)
