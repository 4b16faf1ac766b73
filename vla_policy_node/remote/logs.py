"""The loggers handed to websockets: its DEBUG output prints every handshake header, the API key included."""
from __future__ import annotations

import logging

REDACTED = 'Authorization: [redacted]'


class _RedactAuthorization(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is let through unchanged
            return True
        if 'authorization' in text.lower():
            record.msg, record.args = REDACTED, None
        return True


def websockets_logger(name: str) -> logging.Logger:
    """A logger for websockets' ``logger=`` option that never carries an Authorization header."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _RedactAuthorization) for f in logger.filters):
        logger.addFilter(_RedactAuthorization())
    return logger
