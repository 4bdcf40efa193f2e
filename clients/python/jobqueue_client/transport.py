"""`ApiClient`: the transport both clients share (AgentClient in client.py, ProducerClient
in producer.py): one httpx.Client under /v1/workspaces/{workspace_id}/ with the credential's
headers, a connection of its own for held requests (long-poll), and every error answer turned
into an ApiError (errors.py).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from . import version
from .errors import ServerError, TransportError, error_from_response


class ApiClient:
    """What both clients share (AgentClient in client.py, ProducerClient in producer.py): one
    httpx.Client under /v1/workspaces/{workspace_id}/ sending the credential's headers, a
    connection of its own for held requests (long-poll) that abort_wait() closes from another
    thread, and every error answer turned into an ApiError by `error_from_response`."""

    #: Turns an error answer (status >= 400) into the exception to raise.
    error_from_response = staticmethod(error_from_response)

    def __init__(self, server: str, workspace_id: str, credential_headers: dict[str, str], *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = None):
        self.server = server.rstrip("/")
        self.workspace_id = str(workspace_id)
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=f"{self.server}/v1/workspaces/{self.workspace_id}/",
            headers={**credential_headers, "Accept": "application/json",
                     "User-Agent": version.user_agent(user_agent)},
            timeout=timeout,
            transport=transport,
        )
        # Held requests (wait_seconds) go on a connection of their own, which abort_wait()
        # closes from another thread: a stopping process does not sit out a 50 s wait.
        self._client_args = {"base_url": self._http.base_url, "headers": self._http.headers,
                             "transport": transport}
        self._wait_http: httpx.Client | None = None
        self._wait_lock = threading.Lock()
        self._aborted = False

    def close(self) -> None:
        self.abort_wait()
        self._http.close()

    def abort_wait(self) -> None:
        """End a held request now (from any thread): it raises TransportError, and no
        request waits again on this client."""
        with self._wait_lock:
            self._aborted = True
            held, self._wait_http = self._wait_http, None
        if held is not None:
            held.close()

    def _waiting_client(self) -> httpx.Client:
        with self._wait_lock:
            if self._aborted:
                raise TransportError("The wait was aborted.")
            if self._wait_http is None:
                self._wait_http = httpx.Client(timeout=self.timeout, **self._client_args)
            return self._wait_http

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- plumbing --

    def _request(self, method: str, path: str, *, json: Any = None, params=None,
                 timeout: float | None = None, content=None, headers=None,
                 wait: float = 0, stream: bool = False) -> httpx.Response:
        """Send one request; an error answer raises (the class's error_from_response), a
        lost one raises TransportError. With `stream`, the body of a successful answer is
        left unread: the caller iterates it and closes the response."""
        kwargs: dict[str, Any] = {"params": params}
        if headers:
            kwargs["headers"] = headers
        if json is not None:
            kwargs["json"] = json
        if content is not None:
            kwargs["content"] = content
        if timeout is not None:
            kwargs["timeout"] = timeout
        http = self._http
        if wait:
            http = self._waiting_client()
            kwargs["timeout"] = self.timeout + wait
        try:
            response = http.send(http.build_request(method, path, **kwargs), stream=stream)
        except RuntimeError as exc:
            if not wait:
                raise
            # httpx: the client was closed under the request (abort_wait)
            raise TransportError(  # pragma: no cover -- abort_wait() just before send(): a race
                f"The wait was aborted: {exc}") from None
        except httpx.TransportError as exc:
            raise TransportError.of(exc) from None
        if response.status_code >= 400:
            if stream:
                try:
                    response.read()
                except httpx.TransportError as exc:
                    raise TransportError.of(exc) from None
                finally:
                    response.close()
            raise self.error_from_response(response)
        return response

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(response.status_code, "invalid_response",
                              "The server answered with something that is not JSON.") from exc
