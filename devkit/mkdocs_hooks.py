"""MkDocs hook (mkdocs.yml `hooks:`): docs/api.md and docs/design.md link to source files outside
docs/ (`../service/...`), which read well on a repository browser but are not pages of the site.
Such a link whose file exists in the repository becomes its text and path in code; one whose
file does not exist is left as it is, so `mkdocs build --strict` still fails on it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    here = (docs / page.file.src_path).parent

    def repl(m: re.Match[str]) -> str:
        target = (here / m[2]).resolve()
        if target.is_relative_to(docs) or not target.exists():
            return m[0]
        rel = target.relative_to(docs.parent).as_posix()
        return m[1] if m[1].strip("`") == rel else f"{m[1]} (`{rel}`)"

    return LINK.sub(repl, markdown)
