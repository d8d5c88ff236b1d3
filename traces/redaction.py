"""What counts as a secret, stated once: environment variable names that look secret, and token shapes.

The recorder redacts both before a line reaches a trace; the sandbox keeps secret-named variables out of
worker processes.
"""

from __future__ import annotations

import json
import os
import re

REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|_PAT)$|SECRET|PASSWORD|CREDENTIAL",
                         re.IGNORECASE)
MIN_SECRET_LEN = 8  # shorter values ("1", "true") would redact ordinary text

TOKEN_SHAPES = [
    re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9][A-Za-z0-9_\-]{19,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abeprs]-[A-Za-z0-9\-]{8,}"),
]
# keep the name and separator so a reader still sees which credential was there
NAMED_VALUE = re.compile(
    r"(?i)(x-api-key|authorization|api[_-]?key|aws_secret_access_key|secret[_-]?key|access[_-]?token|"
    r"auth[_-]?token|password)(\\?\"?\s*[:=]\s*\\?\"?)(bearer\s+)?[A-Za-z0-9_\-\.+/=]{8,}")
BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9_\-\.+/=]{8,}")


def looks_secret(name: str) -> bool:
    """True for an environment variable name like ANTHROPIC_API_KEY, AWS_SECRET_ACCESS_KEY or GH_PAT."""
    return SECRET_NAME.search(name) is not None


def secret_values() -> list[str]:
    """Values of the secret-named variables of this process, long ones first (a value may contain another)."""
    values = {v for k, v in os.environ.items() if looks_secret(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every secret value (raw or JSON-escaped) and every token shape replaced by [REDACTED]."""
    for value in secret_values():
        text = text.replace(value, REDACTED).replace(json.dumps(value)[1:-1], REDACTED)
    for shape in TOKEN_SHAPES:
        text = shape.sub(REDACTED, text)
    text = NAMED_VALUE.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) or "") + REDACTED, text)
    return BEARER.sub(lambda m: m.group(1) + REDACTED, text)
