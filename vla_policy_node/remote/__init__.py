"""Remote inference over the openpi WebSocket wire (wire/): the client backend and ``vla_policy_serve``.

frames.py      camera frames as the wire carries them (resize-with-pad to uint8, or raw)
logs.py        websockets' loggers, with the Authorization header redacted
connection.py  one WebSocket kept open from a background event loop, bounded waits and backoff
client.py      RemoteBackend: PolicyRuntime's ``infer`` over the wire (the backend seam, docs/architecture.md)
server.py      vla_policy_serve: a PolicyRuntime behind the same wire

The backend's construction from parameter values is configure code: remote_settings.py, beside settings.py.
"""
