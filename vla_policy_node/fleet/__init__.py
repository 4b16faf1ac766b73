"""The fleet: vla_policy_serve scaled out on Ray Serve (the optional ``fleet`` extra; docs/fleet.md).

- ``config.py``: ``FleetConfig``, the one description of a deployment (no Ray);
- ``affinity.py``: which replica serves which robot (no Ray), used by ``router.py``, Ray Serve's request router;
- ``replica.py``: a policy replica, a batching vla_policy_serve (remote/server.py) as a Serve deployment;
- ``ingress.py``: the openpi wire over WebSocket at Serve's HTTP proxy, the API key, the faults as error frames;
- ``app.py``: the Serve application; ``cluster.py``: Ray on loopback or a cluster; ``cli.py``: vla_policy_fleet.

Only ``config.py`` and ``affinity.py`` import without Ray; nothing outside this folder imports it.
"""
