"""A policy served over the OpenAI chat-completions API (vLLM, SGLang, ...).

Token ids and log-probs are asked for the way the training-oriented servers
report them, and read from whichever shape comes back:

* vLLM: ``return_token_ids`` -> ``prompt_token_ids`` on the response and
  ``token_ids`` on each choice; ``logprobs`` -> ``choice.logprobs.content[i].logprob``,
  whose ``token`` is ``"token_id:<id>"`` with ``return_tokens_as_token_ids``.
* SGLang: ``return_prompt_token_ids`` -> ``prompt_token_ids`` on the choice;
  ``return_meta_info`` -> ``choice.meta_info.output_token_logprobs`` (``[logprob, id, text]``
  or dicts) and ``output_ids``; logprob entries may carry ``token_id``.

A server that reports no ids yields a generation with empty ids and
``ids_from_server=False``; text is never re-tokenized to guess them. A server
that refuses the extra fields (``transformers serve``: HTTP 422 "Unexpected
fields") gets the request again without them, once; the policy then stops
sending them (logged once) and its generations carry no ids.

A server that ignores ``n`` (answers one choice) is topped up with single
requests. :meth:`OpenAIPolicy.resolve_model` works out the model name at
start-up (``/models`` may fail or be empty) with an error that names the
setting to fill in. Tool calls
that a server parsed out of the text come back in ``message.tool_calls``; they
are rendered into the text again as ``<tool_call>{json}</tool_call>`` so the
environment's one parser sees every action the same way.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import random
import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from nextstate.agents.policy import Generation, Policy, PolicyError

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 425, 429} | set(range(500, 600))
ID_PARAMS = {  # vendor extensions; servers ignore the ones they do not know
    "logprobs": True,
    "return_token_ids": True, "return_tokens_as_token_ids": True,  # vLLM
    "return_prompt_token_ids": True, "return_meta_info": True,      # SGLang
    "include_stop_str_in_output": True, "no_stop_trim": True,        # keep "</tool_call>"
}


class _HTTPError(PolicyError):
    """A request the server refused (a 4xx that is not worth retrying)."""

    def __init__(self, message: str, status: int, body: str):
        super().__init__(message)
        self.status, self.body = status, body


def error_line(body: str, limit: int = 300) -> str:
    """A server's error body as one line: an HTML page (a proxy's or a web server's error page)
    by its title (else its text), whitespace collapsed, at most ``limit`` characters."""
    text = body.strip()
    if re.match(r"(?is)(<!doctype html|<html|<head|<body|<\?xml)", text):
        title = re.search(r"(?is)<title[^>]*>(.*?)</title>", text) or re.search(r"(?is)<h1[^>]*>(.*?)</h1>", text)
        text = title.group(1) if title else re.sub(r"(?is)<(script|style).*?</\1>|<[^>]+>", " ", text)
        text = "HTML page: " + html.unescape(text).strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _refuses_id_fields(e: _HTTPError) -> bool:
    """Whether the server refused the request for the vendor fields it does not know."""
    if e.status not in (400, 422):
        return False
    text = e.body.lower()
    return any(k in text for k in ID_PARAMS if k != "logprobs") or \
        any(w in text for w in ("unexpected field", "extra field", "unrecognized", "not permitted"))


class OpenAIPolicy(Policy):
    """Chat completions over ``httpx``, with retries.

    Args:
        base_url: server root (``http://host:8000``) or API root (``.../v1``).
        model: served model name; default the first one ``/models`` lists.
        max_retries: retries after the first attempt, on 408/425/429/5xx,
            connection errors and timeouts, with exponential backoff and jitter
            (``Retry-After`` is honoured); then :class:`PolicyError`.
        request_ids: ask for token ids and log-probs, and for stop strings to be kept
            in the text (see the module docstring); off for servers that reject
            unknown fields.
        extra_body: more request fields (e.g. ``top_k``, ``chat_template_kwargs``).
        tool_choice: sent when given (vLLM needs a tool parser for ``"auto"``).
        model_key: how users set ``model`` (``judge.model``, ``--model``), for error messages.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, *,
                 timeout: float = 300.0, max_retries: int = 4, backoff: float = 0.5,
                 max_backoff: float = 20.0, request_ids: bool = True,
                 extra_body: dict[str, Any] | None = None, tool_choice: str | None = None,
                 max_connections: int = 256, name: str | None = None, model_key: str = "model"):
        url = base_url.rstrip("/")
        self.base_url = url if urlsplit(url).path not in ("", "/") else url + "/v1"
        self.model = model
        self.api_key = api_key
        self.timeout, self.max_retries = timeout, max_retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.id_params = ID_PARAMS if request_ids else {}
        self.extra_body = dict(extra_body or {})
        self.tool_choice = tool_choice
        self.max_connections = max_connections
        self.model_key = model_key
        self.name = name or f"openai:{model or self.base_url}"
        self._n_ignored = False
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    # -- transport ------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # one client per event loop
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.max_connections,
                                  max_keepalive_connections=self.max_connections)
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits)
            self._client_loop = loop
        return self._client

    async def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        url = self.base_url + path
        last = ""
        for attempt in range(self.max_retries + 1):
            delay = min(self.max_backoff, self.backoff * 2 ** attempt) * (0.5 + random.random())
            try:
                resp = await self._http().request(method, url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = type(e).__name__ + (f": {e}" if str(e) else f" (timeout {self.timeout}s)")
            else:
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError:   # not an OpenAI server: a web page, a proxy's answer
                        raise PolicyError(f"{method} {url} answered HTTP {resp.status_code} with a body that "
                                          f"is not JSON: {error_line(resp.text)}") from None
                last = f"HTTP {resp.status_code}: {error_line(resp.text)}"
                if resp.status_code not in RETRY_STATUS:
                    raise _HTTPError(f"{method} {url} failed: {last}", resp.status_code, resp.text[:2000])
                retry_after = resp.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    delay = min(self.max_backoff, float(retry_after))
            if attempt < self.max_retries:
                log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, last, attempt + 1,
                            self.max_retries, delay)
                await asyncio.sleep(delay)
        raise PolicyError(f"{method} {url} failed after {self.max_retries + 1} attempts: {last}")

    async def resolve_model(self) -> str:
        """The model name: the one given, else the first that ``/models`` lists.

        Raises :class:`PolicyError` with a one-line message naming ``model_key``
        when the server does not answer, or it cannot say (``/models`` failing,
        as on ``transformers serve``, or empty) and no name was given.
        """
        if self.model is not None:
            return self.model
        hint = f"set {self.model_key}=<the served model's name>"
        try:
            models = (await self._request("GET", "/models")).get("data") or []
        except PolicyError as e:
            reason = re.sub(r"^after \d+ attempts: ", "", str(e).split(" failed", 1)[-1].lstrip(": "))
            raise PolicyError(f"cannot work out the model name at {self.base_url}: GET /models "
                              f"failed ({reason[:200]}); {hint}") from None
        if not models or not isinstance(models[0], dict) or not models[0].get("id"):
            raise PolicyError(f"{self.base_url}/models lists no model; {hint}")
        self.model = str(models[0]["id"])
        return self.model

    async def _chat(self, messages: list[dict], tools: list[dict] | None,
                    sampling: dict[str, Any], ids: bool = True) -> dict:
        body: dict[str, Any] = {"model": await self.resolve_model(), "messages": messages,
                                **(self.id_params if ids else {}), **self.extra_body}
        if tools:
            body["tools"] = tools
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        body.update({k: v for k, v in sampling.items() if v is not None})
        try:
            data = await self._request("POST", "/chat/completions", body)
        except _HTTPError as e:
            if not (any(k in body for k in ID_PARAMS) and _refuses_id_fields(e)):
                raise
            if self.id_params:  # concurrent requests may all land here: log once
                log.warning("%s refuses the token-id fields (%s); sending requests without them: "
                            "generations from this server carry no token ids and are not trained on",
                            self.base_url, e.body[:200].replace("\n", " "))
            self.id_params = {}
            for key in ID_PARAMS:
                body.pop(key, None)
            data = await self._request("POST", "/chat/completions", body)
        if not data.get("choices"):
            raise PolicyError(f"the server answered without choices: {str(data)[:500]}")
        return data

    # -- the policy -------------------------------------------------------------------
    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        data = await self._chat(messages, tools, sampling)
        return parse_choice(data, data["choices"][0], sampling.get("stop"))

    async def complete(self, messages: list[dict], n: int = 1, temperature: float = 1.0,
                       max_tokens: int = 1024) -> list[str]:
        """``n`` answers from one request (``n`` in the body); a server that answers fewer
        choices (it ignores ``n``) is topped up with one request per missing answer."""
        sampling = {"temperature": temperature, "max_tokens": max_tokens}
        data = await self._chat(messages, None, {"n": n, **sampling} if n != 1 else sampling, ids=False)
        texts = [parse_choice(data, c, None).text for c in data["choices"]][:n]
        if len(texts) < n:
            if not self._n_ignored:
                self._n_ignored = True
                log.warning("%s answered %d of n=%d choices; topping up with single requests",
                            self.base_url, len(texts), n)
            more = await asyncio.gather(*(self._chat(messages, None, sampling, ids=False)
                                          for _ in range(n - len(texts))))
            texts += [parse_choice(d, d["choices"][0], None).text for d in more]
        return texts

    async def aclose(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


def render_tool_calls(tool_calls: list[dict]) -> str:
    """``tool_calls`` of an assistant message as Hermes ``<tool_call>`` text."""
    parts = []
    for call in tool_calls:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass  # left as a string: the environment's parser reports the error
        parts.append("<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args},
                                                ensure_ascii=False) + "</tool_call>")
    return "".join(parts)


def _token_id(entry: dict) -> int | None:
    if isinstance(entry.get("token_id"), int):
        return entry["token_id"]
    token = entry.get("token")
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            return None
    return None


def _response_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """(ids, log-probs) of the sampled tokens from any known server shape; ``[]`` when absent."""
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(e["logprob"]) for e in content if isinstance(e, dict) and "logprob" in e]
    ids: list[int] = list(choice.get("token_ids") or [])                     # vLLM
    meta = choice.get("meta_info") or {}
    entries = meta.get("output_token_logprobs") or []                        # SGLang
    if entries:
        pairs = [(e.get("token_id", e.get("id")), e.get("logprob")) if isinstance(e, dict)
                 else (e[1], e[0]) for e in entries]
        ids = ids or [int(t) for t, _ in pairs]
        logprobs = logprobs or [float(lp) for _, lp in pairs]
    ids = ids or list(meta.get("output_ids") or [])
    if not ids and content:
        from_entries = [_token_id(e) for e in content]
        if all(t is not None for t in from_entries):
            ids = from_entries  # type: ignore[assignment]
    if ids and len(logprobs) != len(ids):
        logprobs = []
    return [int(t) for t in ids], logprobs


def parse_choice(data: dict, choice: dict, stop: str | list[str] | None) -> Generation:
    """A :class:`Generation` from one choice of a chat-completions response."""
    message = choice.get("message") or {}
    text = message.get("content") or ""
    stop_reason = choice.get("stop_reason")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if isinstance(stop_reason, str) and stop_reason in stops and not text.endswith(stop_reason):
        text += stop_reason  # the server trimmed the stop string; the action needs it
    if message.get("tool_calls"):
        text += render_tool_calls(message["tool_calls"])
    prompt_ids = list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or [])
    response_ids, logprobs = _response_tokens(choice)
    from_server = bool(prompt_ids) and bool(response_ids)
    if not from_server:
        prompt_ids, response_ids = [], []
    return Generation(text=text, prompt_ids=[int(t) for t in prompt_ids], response_ids=response_ids,
                      logprobs=logprobs, finish_reason=choice.get("finish_reason") or "stop",
                      ids_from_server=from_server, message=message)
