"""Credentials in URIs: the user and password of a URI found, redacted or left out. Pure text
functions, shared by the compose rules (no credentials in a config) and the tracking store."""

from __future__ import annotations

import re


# user:password@ in a URI (http://user:pw@host, postgresql://user:pw@host/db), also as Hydra
# prints an override, with its colons escaped (http\://user\:pw@host). The user and password
# run to the last @ before the next blank: a raw @ in a password is part of it, as urllib reads
# it (no piece of it is left beside the host). A URI whose authority is empty (sqlite:///x@y.db)
# has none.
CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*\\?://)(?P<userinfo>[^/\s][^\s]*)@")


def redact(text: str) -> str:
    """`text` with the user and password of every URI in it replaced by ***."""
    return CREDENTIALS.sub(lambda m: m["scheme"] + "***@", text)


def without_credentials(uri: str) -> str:
    """`uri` with its user and password left out (to ask a server for its health)."""
    return CREDENTIALS.sub(lambda m: m["scheme"], uri)


def has_credentials(text: str) -> bool:
    """Whether `text` holds a URI with a user or password."""
    return CREDENTIALS.search(text) is not None
