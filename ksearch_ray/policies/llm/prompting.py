"""Prompt templates: package data, one file per call kind, overridable by a user directory.

A template is a Markdown file in `ksearch_ray/llm/prompts/` read with `string.Template`
(`$name` placeholders, `$$` for a literal dollar). Lines `<!-- system -->` and `<!-- user -->`
split it into chat messages; text before the first such line documents the template and is
not sent. Files whose name starts with `_` are fragments shared by several templates (the
output formats); a template uses one as `$ops_format` or `$code_format`.

A same-named file in the override directory (argument, else $KSEARCH_PROMPTS_DIR) wins over
the packaged one, so prompts can be tuned per experiment without touching the package.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from pathlib import Path
from string import Template
from typing import Any

ENV_PROMPTS_DIR = "KSEARCH_PROMPTS_DIR"
CALL_KINDS = (
    "initialize_tree",
    "propose_actions",
    "refine",
    "too_hard",
    "generate_from_spec",
    "generate_from_base",
    "debug",
    "improve",
    "evolve",
)
_ROLE_MARKER = re.compile(r"^<!--\s*(system|user|assistant)\s*-->[ \t]*$", re.MULTILINE)
# Which code-format fragment a task language gets: Triton kernels are Python modules.
_CODE_FORMAT_FRAGMENT = {
    "python": "code_format_python",
    "triton": "code_format_python",
    "cuda": "code_format_cuda",
}


class PromptError(ValueError):
    """A template that cannot be found or filled; the message names the template and the field."""


def _override_dir(prompts_dir: Path | str | None) -> Path | None:
    chosen = prompts_dir if prompts_dir is not None else os.environ.get(ENV_PROMPTS_DIR)
    return Path(chosen) if chosen else None


def load_template(name: str, prompts_dir: Path | str | None = None) -> tuple[str, str]:
    """(text, where it came from) of template or fragment `name` (without `.md`)."""
    filename = f"{name}.md"
    override = _override_dir(prompts_dir)
    if override is not None and (override / filename).is_file():
        path = override / filename
        return path.read_text(encoding="utf-8"), str(path)
    packaged = importlib.resources.files("ksearch_ray.policies.llm") / "prompts" / filename
    if not packaged.is_file():
        known = ", ".join(CALL_KINDS)
        raise PromptError(
            f"no prompt template {filename!r} (packaged kinds: {known}; override dir: {override})"
        )
    return packaged.read_text(encoding="utf-8"), f"ksearch_ray/llm/prompts/{filename}"


def _split_roles(text: str) -> list[tuple[str, str]]:
    markers = list(_ROLE_MARKER.finditer(text))
    if not markers:
        return [("user", text)]
    parts = []
    for marker, following in zip(markers, [*markers[1:], None], strict=True):
        end = following.start() if following else len(text)
        parts.append((marker.group(1), text[marker.end() : end].strip("\n")))
    return parts


def _fragment_exists(name: str, prompts_dir: Path | str | None) -> bool:
    override = _override_dir(prompts_dir)
    if override is not None and (override / f"_{name}.md").is_file():
        return True
    return (importlib.resources.files("ksearch_ray.policies.llm") / "prompts" / f"_{name}.md").is_file()


def _fragments_for(
    identifiers: set[str], fields: dict[str, Any], prompts_dir: Path | str | None
) -> dict[str, str]:
    """Fragment files (`_name.md`) the template names as `$name`, filled with the same fields."""
    fragments: dict[str, str] = {}
    for name in sorted(identifiers - fields.keys() - {"code_format"}):
        if _fragment_exists(name, prompts_dir):
            text, source = load_template(f"_{name}", prompts_dir)
            template = Template(text.strip())
            missing = sorted(set(template.get_identifiers()) - fields.keys())
            if missing:
                raise PromptError(f"{source} needs field(s) {', '.join(missing)}")
            fragments[name] = template.substitute(fields)
    if "code_format" in identifiers and "code_format" not in fields:
        language = str(fields.get("language", ""))
        fragment = _CODE_FORMAT_FRAGMENT.get(language)
        if fragment is None:
            raise PromptError(
                f"$code_format needs a language field of {sorted(_CODE_FORMAT_FRAGMENT)}, got {language!r}"
            )
        fragments["code_format"] = load_template(f"_{fragment}", prompts_dir)[0].strip()
    return fragments


def render(kind: str, /, *, prompts_dir: Path | str | None = None, **fields: Any) -> list[dict[str, str]]:
    """Chat messages for one call kind, with `fields` filling the template's placeholders.

    Fields the template does not use are ignored, so callers may pass a common set; a field it
    uses but did not get raises PromptError naming it.
    """
    text, source = load_template(kind, prompts_dir)
    roles = [(role, Template(body)) for role, body in _split_roles(text)]
    for _, template in roles:
        if not template.is_valid():
            raise PromptError(f"{source}: a '$' not followed by a name (write $$ for a literal dollar)")
    identifiers = {name for _, template in roles for name in template.get_identifiers()}
    values = {**_fragments_for(identifiers, fields, prompts_dir), **fields}
    missing = sorted(identifiers - values.keys())
    if missing:
        raise PromptError(
            f"{source} needs field(s) {', '.join(missing)}; got {', '.join(sorted(fields)) or 'none'}"
        )
    return [{"role": role, "content": template.substitute(values).strip() + "\n"} for role, template in roles]


_FENCE_TAGS = {
    ".py": "python",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".h": "cpp",
    ".hpp": "cpp",
}


def format_sources(sources: dict[str, str]) -> str:
    """Show a solution's files in the same shape the model is asked to answer in."""
    parts = []
    for name, source in sources.items():
        tag = _FENCE_TAGS.get(Path(name).suffix.lower(), "")
        # A fence longer than any backtick run inside the file, so the file cannot close it early.
        longest_run = max((len(run) for run in re.findall(r"`+", source)), default=0)
        fence = "`" * max(3, longest_run + 1)
        parts.append(f"### file: {name}\n{fence}{tag}\n{source.rstrip()}\n{fence}")
    return "\n\n".join(parts)
