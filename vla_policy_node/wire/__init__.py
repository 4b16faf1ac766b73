"""The openpi WebSocket wire, below the parameter table: what travels and what each server expects.

auth.py        the API key header, checked in constant time
codec.py       msgpack-numpy frames (bounded, never unpickles)
errors.py      RemoteError: a fault kind -> its SkipReason
profiles.py    the servers' key layouts, reply forms and error frames (openpi, sglang, vLLM-Omni)

No connection, no backend, no parameters here: the parameter table (params.py) reads the profile and layout
names from this package, the remote backend (remote/) and vla_policy_serve (remote/server.py) speak it.
"""
