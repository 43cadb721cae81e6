"""RemoteRewardModel: scores from a reward or rerank model served over HTTP.

The client POSTs JSON with the standard library (urllib), in batches, with a timeout and
retries with exponential backoff on connection failures, timeouts, HTTP 429 and 5xx.
Anything else — a server that stays unreachable, an HTTP error, a reply that is not JSON,
has the wrong number of scores, or holds a non-finite or non-numeric score — raises
:class:`~hybridflow.errors.RewardError` naming the URL and what went wrong; a score is
never silently replaced by 0.

Request formats (``api_format``), one per entry of :data:`REQUEST_FORMATS`:

``"scores"`` — one request per ``batch_size`` responses, each paired with its prompt::

    {"model": "rm", "query": ["2+3=", "2+3="], "responses": ["5", "6"]}

``"rerank"`` — the rerank API of vLLM (``/rerank``, ``/v1/rerank``), Jina and Cohere, and
of text-embeddings-inference (``/rerank``): one request per distinct prompt, its responses
as documents (also sent as ``texts`` for TEI, with ``raw_scores`` true)::

    {"model": "rm", "query": "2+3=", "documents": ["5", "6"], "texts": ["5", "6"], "raw_scores": true}

``"auto"`` (the default) picks ``rerank`` when the URL's path ends in ``rank`` or
``rerank`` (the seed article's ``/v1/rank``), ``scores`` otherwise.

Replies accepted, for either format (scores in request order unless an ``index`` says otherwise):
``{"scores": [...]}``; a list of numbers; ``{"results": [{"index": i, "relevance_score": s}]}``
(vLLM / Jina / Cohere rerank); ``{"data": [{"index": i, "score": s}]}`` (vLLM ``/score``);
``[{"index": i, "score": s}]`` (TEI ``/rerank``).
"""
from __future__ import annotations

import json
import math
import numbers
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlparse

import torch

from ..errors import BatchError, RewardError
from ..runtime.engines import RewardOutput

__all__ = ["RemoteRewardModel", "REQUEST_FORMATS", "parse_scores"]

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _prompt_text(prompt: Any) -> str:
    """A prompt as text: strings as they are, chat messages as their contents joined by newlines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "content" in m for m in prompt):
        return "\n".join(str(m["content"]) for m in prompt)
    return str(prompt)


def _scores_requests(model: str | None, prompts: list[str], responses: list[str], size: int) -> list[tuple[list[int], dict]]:
    out = []
    for start in range(0, len(responses), size):
        rows = list(range(start, min(start + size, len(responses))))
        out.append((rows, {"model": model, "query": [prompts[i] for i in rows], "responses": [responses[i] for i in rows]}))
    return out


def _rerank_requests(model: str | None, prompts: list[str], responses: list[str], size: int) -> list[tuple[list[int], dict]]:
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(i)
    out = []
    for prompt, rows in groups.items():
        for start in range(0, len(rows), size):
            part = rows[start:start + size]
            docs = [responses[i] for i in part]
            out.append((part, {"model": model, "query": prompt, "documents": docs, "texts": docs, "raw_scores": True}))
    return out


REQUEST_FORMATS: dict[str, Callable[[str | None, list[str], list[str], int], list[tuple[list[int], dict]]]] = {
    "scores": _scores_requests, "rerank": _rerank_requests,
}
"""Format name -> ``(model, prompts, responses, batch_size) -> [(response rows, JSON body), ...]``."""


def _entry_score(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        for key in ("score", "relevance_score", "reward"):
            if key in entry:
                return entry[key]
        raise ValueError(f"an entry has none of score / relevance_score / reward: {json.dumps(entry)[:120]}")
    return entry


def parse_scores(reply: Any, expected: int) -> list[float]:
    """Scores in request order from any accepted reply shape; ValueError saying what is wrong."""
    items = reply
    if isinstance(reply, Mapping):
        for key in ("scores", "results", "data", "rewards"):
            if key in reply:
                items = reply[key]
                break
        else:
            raise ValueError(f"the reply has none of the keys scores / results / data; keys: {sorted(reply)}")
    if not isinstance(items, list):
        raise ValueError(f"expected a list of scores, got {type(items).__name__}")
    if len(items) != expected:
        raise ValueError(f"the reply has {len(items)} scores for {expected} responses")
    scores: list[Any] = [None] * expected
    for position, entry in enumerate(items):
        index = entry.get("index", position) if isinstance(entry, Mapping) else position
        if not isinstance(index, int) or not 0 <= index < expected or scores[index] is not None:
            raise ValueError(f"entry {position} has an invalid or repeated index {index!r}")
        scores[index] = _entry_score(entry)
    for i, value in enumerate(scores):
        if isinstance(value, list) and len(value) == 1:  # [[s], ...] from classification endpoints
            value = scores[i] = value[0]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"score {i} is {value!r}, not a number")
        if not math.isfinite(float(value)):
            raise ValueError(f"score {i} is {value}, not a finite number")
    return [float(v) for v in scores]


class RemoteRewardModel:
    """A reward source that asks an HTTP server for the score of each prompt + response.

    Args:
        api_url: the endpoint, e.g. ``http://localhost:8000/v1/rank``.
        model_name: sent as ``"model"`` (the served model's name).
        api_format: ``"auto"``, ``"scores"`` or ``"rerank"`` (see the module docstring).
        batch_size: responses per request.
        timeout: seconds to wait for each reply.
        max_retries: further attempts after a failed one (connection error, timeout, 408/429/5xx).
        backoff: seconds before the first retry; doubled before each next one.
        headers: extra HTTP headers (e.g. ``{"Authorization": "Bearer ..."}``).
    """

    def __init__(self, api_url: str, model_name: str | None = None, *, api_format: str = "auto", batch_size: int = 64,
                 timeout: float = 30.0, max_retries: int = 3, backoff: float = 0.5, headers: Mapping[str, str] | None = None):
        parsed = urlparse(api_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise RewardError(f"api_url {api_url!r} is not an http(s) URL like http://localhost:8000/v1/rank")
        if api_format == "auto":
            api_format = "rerank" if parsed.path.rstrip("/").endswith(("rank", "rerank")) else "scores"
        if api_format not in REQUEST_FORMATS:
            raise RewardError(f"api_format {api_format!r} is unknown; use auto, {', '.join(REQUEST_FORMATS)}")
        if batch_size < 1 or timeout <= 0 or max_retries < 0 or backoff < 0:
            raise RewardError("RemoteRewardModel needs batch_size >= 1, timeout > 0, max_retries >= 0, backoff >= 0")
        self.api_url, self.model_name, self.api_format = api_url, model_name, api_format
        self.batch_size, self.timeout, self.max_retries, self.backoff = batch_size, timeout, max_retries, backoff
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}

    def __repr__(self) -> str:
        return f"RemoteRewardModel({self.api_url!r}, model_name={self.model_name!r}, api_format={self.api_format!r})"

    def score_texts(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        """One score per (prompt, response) pair."""
        if len(prompts) != len(responses):
            raise RewardError(f"{len(prompts)} prompts for {len(responses)} responses")
        texts = [_prompt_text(p) for p in prompts]
        scores: list[float] = [0.0] * len(responses)
        for rows, body in REQUEST_FORMATS[self.api_format](self.model_name, texts, list(responses), self.batch_size):
            reply = self._post(body)
            try:
                values = parse_scores(reply, len(rows))
            except ValueError as err:
                raise RewardError(f"reward server {self.api_url}: malformed reply ({err})") from None
            for row, value in zip(rows, values):
                scores[row] = value
        return scores

    def score(self, batch) -> RewardOutput:
        """Scores ``(b,)`` float32 of the batch's ``responses`` text column against its ``prompt`` column."""
        try:
            prompts, responses = list(batch["prompt"]), list(batch["responses"])
        except (KeyError, LookupError, BatchError):
            raise RewardError("RemoteRewardModel needs the batch's 'prompt' and 'responses' text columns; "
                              "the rollout engine adds 'responses' when it has a tokenizer") from None
        return RewardOutput(torch.tensor(self.score_texts(prompts, responses), dtype=torch.float32), {})

    def _post(self, body: dict) -> Any:
        data = json.dumps(body).encode("utf-8")
        last, timed_out = "", False
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.api_url, data=data, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                    text = reply.read().decode("utf-8", errors="replace")
            except urllib.error.HTTPError as err:
                detail = err.read().decode("utf-8", errors="replace")[:200]
                last = f"HTTP {err.code} {err.reason}: {detail}"
                if err.code in RETRY_STATUS:
                    continue
                raise RewardError(f"reward server {self.api_url} answered {last}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
                timed_out = _is_timeout(err)
                continue
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise RewardError(f"reward server {self.api_url}: malformed reply (not JSON): {text[:200]!r}") from None
        if timed_out:
            raise RewardError(f"reward server {self.api_url} timed out after {self.timeout:g} s "
                              f"({self.max_retries + 1} attempts): it is reachable but slower than the timeout; "
                              f"raise timeout= (e.g. RemoteRewardModel(..., timeout={self.timeout * 4:g})) or "
                              "lower batch_size=")
        raise RewardError(f"reward server {self.api_url} unreachable after {self.max_retries + 1} attempts "
                          f"(last error: {last}); is it running, and is the URL right?")


def _is_timeout(err: BaseException) -> bool:
    """Whether a failed request timed out waiting for the server (it answered the connection, not the request)."""
    import socket

    reason = getattr(err, "reason", None)
    return isinstance(err, (TimeoutError, socket.timeout)) or isinstance(reason, (TimeoutError, socket.timeout)) \
        or "timed out" in str(reason or err).lower()
