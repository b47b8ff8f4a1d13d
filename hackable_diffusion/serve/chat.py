"""Chat messages to a prompt: the checkpoint's own chat template when it ships one, a plain template otherwise.

A Hugging Face checkpoint's `tokenizer_config.json` (`chat_template`) or `chat_template.jinja` is rendered with
jinja2 as transformers' `apply_chat_template(..., add_generation_prompt=True)` does, with BOS left out (the engine
prepends it). Toolbox runs trained from scratch have no template, so messages are joined as

    System: {content}\\n\\nUser: {content}\\n\\nAssistant: {content}\\n\\n ... Assistant:

(roles capitalised, a blank line between turns, the prompt ends with "Assistant:" for the model to continue).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

ROLES = ("system", "user", "assistant")


def plain_template(messages: Sequence[dict[str, Any]]) -> str:
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(turns + ["Assistant:"])


def find_chat_template(directory: str | pathlib.Path | None) -> str | None:
    """The chat template a checkpoint directory ships, or None."""
    if not directory:
        return None
    directory = pathlib.Path(directory)
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        template = json.loads(config_file.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return None


def check_messages(messages: Any) -> list[dict[str, str]]:
    """Validated messages; ValueError names what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {list(ROLES)}.")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI's content parts: only text parts are understood
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise ValueError(f"messages[{i}].content: only text parts are supported.")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string.")
        out.append({"role": m["role"], "content": content})
    return out


def render(messages: Sequence[dict[str, str]], template: str | None, bos_text: str = "<bos>") -> str:
    """The prompt text for `messages` (the engine adds BOS itself, so a leading BOS the template writes is cut)."""
    if template is None:
        return plain_template(messages)
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    text = env.from_string(template).render(
        messages=list(messages), add_generation_prompt=True, bos_token=bos_text, eos_token="<eos>"
    )
    return text[len(bos_text) :] if text.startswith(bos_text) else text
