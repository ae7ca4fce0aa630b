"""Addresses of ``grpo serve`` replicas as the configuration spells them (no torch imported)."""

from __future__ import annotations

from urllib.parse import urlsplit


def parse_server_urls(text: str) -> list[str]:
    """Split ``vllm_server_urls`` into base URLs; raise ``ValueError`` naming a bad one.

    >>> parse_server_urls("http://gen1:8000, gen2:8001/")
    ['http://gen1:8000', 'http://gen2:8001']
    """
    urls = []
    for part in text.split(","):
        part = part.strip().rstrip("/")
        if not part:
            continue
        if "://" not in part:
            part = f"http://{part}"
        split = urlsplit(part)
        if split.scheme != "http" or not split.hostname or split.port is None:
            raise ValueError(f"server address {part!r} is not http://HOST:PORT")
        urls.append(part)
    if not urls:
        raise ValueError("no server address given; e.g. http://localhost:8000")
    return urls
