"""A small chat-completions client that keeps everything the verifier needs: raw chunks, the
prompt ids wherever the engine puts them, and per-choice text and token ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit.base.extras import require
from toolkit.base.sse import iter_sse, parse_sse
from toolkit.verify.accounting import Split, StreamSplit, split_from_message

require("verify", ("httpx",), "toolkit verify")
import httpx  # noqa: E402


class HTTPStatusError(AssertionError):
    """The server answered with an error status; ``status`` and ``body`` say what. (An AssertionError:
    where no check expects it, it fails the check.)"""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body

    def mentions(self, word: str) -> bool:
        return word in self.body


class ServerGone(Exception):
    """The server stopped answering (it died or was killed) while a check ran."""


@dataclass
class ChoiceOutcome:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: list[Any] = field(default_factory=list)
    ids_seen: bool = False  # whether any token_ids field arrived at all
    split: Split = field(default_factory=Split)  # reasoning, content and tool calls as the parsers split them
    stream_split: StreamSplit | None = field(default=None, repr=False)  # while streaming


@dataclass
class ChatOutcome:
    prompt_token_ids: list[int] | None
    choices: dict[int, ChoiceOutcome]
    stream: bool
    prompt_ids_on_first_chunk: bool = False
    chunks: int = 0
    raw: Any = None


def _prompt_ids(payload: dict) -> list[int] | None:
    ids = payload.get("prompt_token_ids")
    if ids is None:
        for choice in payload.get("choices") or []:
            if choice.get("prompt_token_ids") is not None:
                return list(choice["prompt_token_ids"])
    return list(ids) if ids is not None else None


class ChatClient:
    def __init__(self, base_url: str, model: str, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _refused(self, response: httpx.Response) -> HTTPStatusError:
        """The error for a non-200 answer, on a fresh connection pool: some servers drop the connection
        after an error answer (vLLM 0.25's catch-all handler re-raises after sending its 400, and uvicorn
        closes the socket), and the next request must not be sent on it."""
        error = HTTPStatusError(response.status_code, response.text)
        timeout = self.http.timeout
        self.http.close()
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)
        return error

    def body(self, messages: list[dict] | None, **extra: Any) -> dict:
        body: dict[str, Any] = {"model": self.model, "temperature": 0, "max_tokens": 24, "return_token_ids": True}
        if messages is not None:
            body["messages"] = messages
        body.update(extra)
        return body

    def chat(self, messages: list[dict] | None, *, stream: bool = False, **extra: Any) -> ChatOutcome:
        body = self.body(messages, stream=stream, **extra)
        try:
            if stream:
                return self._stream(body)
            response = self.http.post("/v1/chat/completions", json=body)
        except httpx.TransportError as exc:
            raise ServerGone(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise self._refused(response)
        payload = response.json()
        choices = {}
        for choice in payload["choices"]:
            message = choice.get("message") or {}
            ids = choice.get("token_ids")
            choices[choice["index"]] = ChoiceOutcome(
                text=message.get("content") or "",
                token_ids=list(ids or []),
                finish_reason=choice.get("finish_reason"),
                tool_calls=message.get("tool_calls") or [],
                ids_seen=ids is not None,
                split=split_from_message(message),
            )
        return ChatOutcome(_prompt_ids(payload), choices, False, raw=payload)

    def _stream(self, body: dict) -> ChatOutcome:
        outcome = ChatOutcome(None, {}, True, raw=[])
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise self._refused(response)
            for chunk in iter_sse(response.iter_lines()):
                outcome.raw.append(chunk)
                prompt_ids = _prompt_ids(chunk)
                if prompt_ids is not None:
                    if outcome.chunks == 0:
                        outcome.prompt_ids_on_first_chunk = True
                    if outcome.prompt_token_ids is None:
                        outcome.prompt_token_ids = prompt_ids
                outcome.chunks += 1
                for choice in chunk.get("choices") or []:
                    state = outcome.choices.setdefault(choice["index"], ChoiceOutcome())
                    delta = choice.get("delta") or {}
                    if state.stream_split is None:
                        state.stream_split = StreamSplit()
                    state.stream_split.add(delta)
                    state.text += delta.get("content") or ""
                    state.tool_calls.extend(delta.get("tool_calls") or [])
                    ids = choice.get("token_ids")
                    if ids is None:
                        ids = delta.get("token_ids")
                    if ids is not None:
                        state.ids_seen = True
                        state.token_ids.extend(ids)
                    if choice.get("finish_reason"):
                        state.finish_reason = choice["finish_reason"]
        for state in outcome.choices.values():
            if state.stream_split is not None:
                state.split = state.stream_split.split()
        return outcome

    def responses(self, body: dict[str, Any], *, stream: bool) -> Any:
        """POST /v1/responses: the parsed SSE events when streaming, else the response object."""
        body = {"model": self.model, **body, "stream": stream}
        try:
            if not stream:
                response = self.http.post("/v1/responses", json=body)
                if response.status_code != 200:
                    raise self._refused(response)
                return response.json()
            with self.http.stream("POST", "/v1/responses", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise self._refused(response)
                return parse_sse(list(response.iter_lines()))
        except httpx.TransportError as exc:
            raise ServerGone(f"{type(exc).__name__}: {exc}") from exc
