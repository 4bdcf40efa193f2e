"""A small agent for test_fencing.py, on the client library only: claims one job, waits for
its go file, writes to the fenced store with the claim's fencing token, then reports the job
done. Prints one line per step (`claimed attempt=N`, `store status=... body=...`,
`report ...`). Environment: JOBQUEUE_SERVER, JOBQUEUE_WORKSPACE, JOBQUEUE_AGENT,
JOBQUEUE_TOKEN, FENCED_STORE (its URL), GO_FILE, WRITE_VALUE."""

import json
import os
import sys
import time

import httpx
from jobqueue_client import AgentClient, ApiError


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    env = os.environ
    client = AgentClient(env["JOBQUEUE_SERVER"], env["JOBQUEUE_WORKSPACE"],
                         env["JOBQUEUE_AGENT"], env["JOBQUEUE_TOKEN"], timeout=5)
    claim = None
    while claim is None:
        claim = client.claim_next()
        if claim is None:
            time.sleep(0.1)
    say(f"claimed attempt={claim.attempt} job={claim.job_id}")
    while not os.path.exists(env["GO_FILE"]):  # a SIGSTOP lands here
        time.sleep(0.05)
    answer = httpx.post(f"{env['FENCED_STORE']}/write", timeout=5, json={
        "token": claim.fencing_token, "key": "result", "value": env["WRITE_VALUE"]})
    say(f"store status={answer.status_code} body={json.dumps(answer.json())}")
    try:
        client.report(claim.job_id, claim.claim_id, "successful")
        say("report accepted")
    except ApiError as exc:
        say(f"report refused code={exc.code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
