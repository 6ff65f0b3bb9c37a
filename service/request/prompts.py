"""sentence-transformers' prompts: the artifact keeps the directory's `prompts` and
`default_prompt_name` (manifest `extra`, factory/build.py), and a text to embed gets its prompt
before it, as `encode(prompt_name=...)` does: the prompt's tokens count toward max_length.

`/v1/embeddings` and TEI's `/embed` take `prompt_name`, KServe a `prompt_name` parameter; without
one, the model's default prompt applies, on every path that embeds (binary frames and batch jobs
included). Only embeddings get a prompt: a classifier or reranker has none.
"""

from __future__ import annotations

from typing import Any

from ringserve.service.request.errors import RequestError, Rule
from ringserve.workers.artifact import Manifest

UNKNOWN = Rule("prompt_name {name} is not one of this model's prompts: {known}")


def prompts_of(manifest: Manifest) -> dict[str, str]:
    prompts = getattr(manifest, "extra", {}).get("prompts")
    return dict(prompts) if isinstance(prompts, dict) else {}


def default_prompt_name(manifest: Manifest) -> str | None:
    name = getattr(manifest, "extra", {}).get("default_prompt_name")
    return name if isinstance(name, str) and name in prompts_of(manifest) else None


def prompt_bytes(manifest: Manifest, name: Any = None) -> bytes:
    """The prompt `name` (None: the model's default, if it has one) as UTF-8, b"" for none; an
    unknown name is a 400 that lists the model's prompts."""
    prompts = prompts_of(manifest)
    if name is None:
        name = default_prompt_name(manifest)
        if name is None:
            return b""
    if not isinstance(name, str) or name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise RequestError(400, UNKNOWN.say(name=repr(name), known=known))
    return prompts[name].encode("utf-8")


def with_prompt(manifest: Manifest, name: Any, texts: list[bytes]) -> list[bytes]:
    """Each text with the prompt before it."""
    prompt = prompt_bytes(manifest, name)
    return [prompt + t for t in texts] if prompt else texts


def listing(manifest: Manifest) -> dict[str, Any]:
    """What /v1/models says of a model's prompts (nothing for a model without any)."""
    prompts = prompts_of(manifest)
    if not prompts:
        return {}
    return {"prompts": prompts, "default_prompt_name": default_prompt_name(manifest)}
