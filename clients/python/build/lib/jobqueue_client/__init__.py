"""The reference pull agent: `jobqueue-agent` (see cli.py).

Nothing in this package imports Django or `jobqueue`: it runs on providers' machines and talks
to the service only over the HTTP API (client.py).
"""
