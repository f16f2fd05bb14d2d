"""Credentials in tracking URIs: found, redacted for anything written or printed, and handed to
MLflow the way it reads them (a server's through its own variables, a database's in its URI).
One place, so that the store, the sweep's console and the config rules read a URI alike."""

from __future__ import annotations

import logging
import os


from src.compose.uris import CREDENTIALS, has_credentials, redact, without_credentials  # noqa: F401  (this module's API too)


def redact_console() -> None:
    """Take credentials out of every log line of this process: a store given through the
    environment may carry them (a database's password stays in its URI). Done where records are
    made, not by a handler filter, because Hydra's launcher configures new handlers just before
    it prints."""
    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def make_redacted(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if "@" in str(record.msg) or record.args:
            message = record.getMessage()
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, ()
        return record

    make_redacted.redacts = True
    logging.setLogRecordFactory(make_redacted)


def take_credentials(uri: str) -> str:
    """`uri` as MLflow is given it. A tracking server's user and password move to MLflow's own
    variables (MLFLOW_TRACKING_USERNAME/PASSWORD, inherited by every process of the sweep; ones
    already set win), so the URI the lab logs, prints and writes holds no secret. A database
    keeps them in its URI, percent-encoded as its driver reads them (a raw @ or : in a password
    would otherwise cut it short and put the rest where the host goes)."""
    from urllib.parse import quote, unquote

    match = CREDENTIALS.match(uri)
    if match is None:
        return uri
    user, colon, password = match["userinfo"].partition(":")
    user, password = unquote(user), unquote(password)
    if uri.lower().startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", user)
        if password:
            os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", password)
        return match["scheme"] + uri[match.end():]
    userinfo = quote(user, safe="") + (colon and ":" + quote(password, safe=""))
    return match["scheme"] + userinfo + "@" + uri[match.end():]
