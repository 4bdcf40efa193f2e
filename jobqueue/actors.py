"""Who made a transition: the `actor` written on every job event, one format per caller."""

REAPER = "reaper"


def agent_actor(job_agent_id) -> str:
    """A job agent, by id (its token, or the workspace key acting on its path)."""
    return f"agent:{job_agent_id}"


def operator_actor(username: str) -> str:
    """A staff user in the admin."""
    return f"operator:{username}"


def producer_actor(api_key_id) -> str:
    """A workspace API key (producers and operators over HTTP)."""
    return f"producer:api_key:{api_key_id}"
