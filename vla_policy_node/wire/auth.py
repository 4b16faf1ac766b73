"""The API key on the openpi wire: ``Authorization: Api-Key <key>``, sent by the remote backend and checked by
vla_policy_serve and the fleet's ingress in one way."""
from __future__ import annotations

import hmac
from typing import Optional


def authorization(api_key: str) -> str:
    """The Authorization header's value that carries ``api_key``."""
    return f'Api-Key {api_key}'


def carries_key(header: Optional[str], api_key: str) -> bool:
    """Whether a request's Authorization header (None: absent) carries ``api_key``. The comparison takes the same
    time wherever the bytes first differ (hmac.compare_digest on bytes), so a client cannot find the key byte by
    byte from how long refusals take. Any str encodes (surrogateescape: nothing a client sends raises here)."""
    given = (header or '').encode('utf-8', 'surrogateescape')
    return hmac.compare_digest(given, authorization(api_key).encode('utf-8', 'surrogateescape'))
