"""The playground page at /web (`/` leads there): one HTML page, its script and its style, all served from
the package; no CDN. Off with KOKORO_WEB=false."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

PAGE_DIR = Path(__file__).resolve().parents[2] / "web"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/web")


@router.get("/web")
async def page() -> FileResponse:
    return FileResponse(
        PAGE_DIR / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"}
    )


def install_web(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/web/static", StaticFiles(directory=PAGE_DIR), name="web-static")
