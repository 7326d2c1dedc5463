"""What a refused patch-sweep request gets back: ``BadRequest`` (one sentence saying what to change)
and its JSON response, in OpenAI's shape ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

from typing import Any


class BadRequest(Exception):
    """A request the server refuses; ``status`` is 400 unless the fault is the server's or a run is gone."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error_response(message: str, status: int = 400) -> Any:
    from fastapi.responses import JSONResponse  # FastAPI only on the API server, where the routes run

    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)
