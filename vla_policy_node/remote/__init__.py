"""Remote inference over the openpi WebSocket wire: the client backend and ``vla_policy_serve``.

codec.py       msgpack-numpy frames (bounded, never unpickles)
errors.py      RemoteError: a fault kind -> its SkipReason
profiles.py    the servers' key layouts, reply forms and error frames (openpi, sglang, vLLM-Omni)
frames.py      camera frames as the wire carries them (resize-with-pad to uint8, or raw)
logs.py        websockets' loggers, with the Authorization header redacted
connection.py  one WebSocket kept open from a background event loop, bounded waits and backoff
client.py      RemoteBackend: PolicyRuntime's ``infer`` over the wire (the backend seam, SEAM.md section 2)
settings.py    parameter values -> RemoteBackend (the backend seam of settings.configure)
server.py      vla_policy_serve: a PolicyRuntime behind the same wire
"""
