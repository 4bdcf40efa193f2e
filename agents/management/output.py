"""How the bootstrap commands print what they made: one JSON object, or `key: value` lines."""

import json


def write_result(stdout, result: dict, as_json: bool) -> None:
    if as_json:
        stdout.write(json.dumps(result))
        return
    for key, value in result.items():
        stdout.write(f"{key}: {value}")
