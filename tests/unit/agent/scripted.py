"""A stand-in for the service in the client libraries' unit tests (httpx.MockTransport): it
answers each request with the next queued answer, (status, json body | bytes | None[,
headers]), or raises it (an exception: a lost answer). Subclasses record what they need."""

import httpx


class ScriptedServer:
    def __init__(self, *answers):
        self.answers = list(answers)

    def record(self, request: httpx.Request) -> None:
        """Called with each request (its body already read)."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.record(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body, *headers = answer
        headers = headers[0] if headers else {}
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers=headers)
        if body is None:
            return httpx.Response(status, headers=headers)
        return httpx.Response(status, json=body, headers=headers)
