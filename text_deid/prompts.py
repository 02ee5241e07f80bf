"""The LLM's prompts, read from `prompts/`: instructions, fictional few-shot examples, answer schemas.

The whole folder is one versioned unit: `VERSION` names it and a SHA-256 over every file it holds is
computed at load time (never stored, so it cannot go stale); both land in audit and eval records.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
FILES = ("VERSION", "instructions.md", "examples.jsonl", "schema.json",
         "second-opinion.md", "second-opinion-examples.jsonl", "second-opinion-schema.json")


@dataclass(frozen=True)
class PromptSet:
    version: str
    sha256: str
    instructions: str
    examples: tuple[dict, ...]  # {"note": str, "items": [{"text", "type"}]}
    schema: dict
    second_opinion: str
    second_opinion_examples: tuple[dict, ...]  # {"category", "candidate", "excerpt", "verdict"}
    second_opinion_schema: dict

    @property
    def label(self) -> str:
        """What audit and eval records carry: the version and the content hash."""
        return f"{self.version} sha256:{self.sha256}"

    def detector_messages(self, note: str) -> list[dict]:
        """Chat messages asking for the PHI in `note`: instructions, the examples as turns, then the note."""
        messages = [{"role": "system", "content": self.instructions}]
        for ex in self.examples:
            messages.append({"role": "user", "content": ex["note"]})
            messages.append({"role": "assistant", "content": json.dumps({"items": ex["items"]}, ensure_ascii=False)})
        messages.append({"role": "user", "content": note})
        return messages

    def second_opinion_messages(self, category: str, candidate: str, excerpt: str) -> list[dict]:
        """Chat messages asking whether one marked candidate is PHI."""
        messages = [{"role": "system", "content": self.second_opinion}]
        for ex in self.second_opinion_examples:
            messages.append({"role": "user", "content": second_opinion_question(ex["category"], ex["candidate"], ex["excerpt"])})
            messages.append({"role": "assistant", "content": json.dumps({"verdict": ex["verdict"]})})
        messages.append({"role": "user", "content": second_opinion_question(category, candidate, excerpt)})
        return messages


def second_opinion_question(category: str, candidate: str, excerpt: str) -> str:
    return f"Suggested type: {category}\nCandidate: {candidate}\nExcerpt:\n{excerpt}"


def _jsonl(text: str) -> tuple[dict, ...]:
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@lru_cache(maxsize=4)
def load(folder: Path = PROMPTS) -> PromptSet:
    """The prompt set in `folder`; ValueError when a file is missing or malformed."""
    try:
        raw = {name: (folder / name).read_bytes() for name in FILES}
        digest = hashlib.sha256()
        for name in FILES:  # name and length framed, so moving bytes between files changes the hash
            digest.update(f"{name}\0{len(raw[name])}\0".encode())
            digest.update(raw[name])
        text = {name: data.decode("utf-8") for name, data in raw.items()}
        return PromptSet(
            version=text["VERSION"].strip(),
            sha256=digest.hexdigest(),
            instructions=text["instructions.md"].strip(),
            examples=_jsonl(text["examples.jsonl"]),
            schema=json.loads(text["schema.json"]),
            second_opinion=text["second-opinion.md"].strip(),
            second_opinion_examples=_jsonl(text["second-opinion-examples.jsonl"]),
            second_opinion_schema=json.loads(text["second-opinion-schema.json"]),
        )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"prompts in {folder}: {type(e).__name__}: {e}") from None
