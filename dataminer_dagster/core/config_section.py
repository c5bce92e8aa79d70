"""What every section of a project's config shares: strict validation (an unknown key is an
error that names it), bounded numbers, frozen values, and the few value types several sections
use. Each stage declares its own section in its folder (`assets/<stage>/config.py`);
`dataminer_dagster.config` composes them into the project config."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Not starting with '-': a name that reads as an option could not be given to a command
# (`dataminer status -rf`) without a `--` before it.
SAFE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"

# The largest number any key may hold. Every number of a config ends up in a call with a limit
# (itertools.islice, socket timeouts, datetime arithmetic, PostgreSQL integer columns), and
# infinity or 10**30 passed validation only to fail there; this bound is inside all of them and
# far above any sensible value (68 years in seconds, 2 PB in MB).
MAX_NUMBER = 2**31 - 1
# Text models read a few dozen tokens of a prompt (SigLIP2 64, OWLv2 16, about four characters a
# token in English) and drop the rest; a prompt this long is a mistake (a pasted file), not a
# prompt. Which model cuts where is known only once it is loaded: the stage that embeds the
# prompts warns about those it cuts.
MAX_PROMPT_CHARS = 1000
# A config is read from a file someone may have handed over: every list and text in it is bounded
# (a URL list longer than this belongs in a url_file, which is read line by line), and text may
# not hold control characters (a NUL cannot be stored in PostgreSQL text and failed the project's
# catalog; line breaks and tabs are kept, a YAML block scalar ends in one).
MAX_LIST_ITEMS = 10_000
MAX_TEXT_CHARS = 16_384
_CONTROL_CHARACTERS = frozenset(chr(c) for c in (*range(32), 127)) - {"\t", "\n", "\r"}


class ConfigError(ValueError):
    """A project config that cannot be used; the message names the file, the key and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Keys that change how a stage runs, not what it makes (a device, a batch size): changing one
    # leaves the work done with the old value current.
    RUN_SETTINGS: ClassVar[frozenset[str]] = frozenset()
    # Keys added by a later release: left out of the fingerprint while they hold their default,
    # so that upgrading does not make the work of every registered project stale.
    ADDED_LATER: ClassVar[frozenset[str]] = frozenset()

    def results_view(self) -> dict[str, Any]:
        """What of this section the output of a stage that reads it depends on (its part of the
        stage's fingerprint)."""
        defaults = {
            key
            for key in self.ADDED_LATER
            if getattr(self, key)
            == type(self).model_fields[key].get_default(call_default_factory=True)
        }
        return self.model_dump(mode="json", exclude=set(self.RUN_SETTINGS) | defaults)

    @field_validator("*", mode="before")
    @classmethod
    def _bounded_text_and_lists(cls, value: Any) -> Any:
        if isinstance(value, list | tuple) and len(value) > MAX_LIST_ITEMS:
            raise ValueError(
                f"has {len(value):,} items; a list may have at most {MAX_LIST_ITEMS:,}"
            )
        for text in value if isinstance(value, list | tuple) else (value,):
            if isinstance(text, str):
                check_text(text)
        return value

    @field_validator("*")
    @classmethod
    def _bounded_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return value
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise ValueError(f"must be a finite number no larger than {MAX_NUMBER:,}")
        return value


def check_text(text: str) -> str:
    """A text of a config as every key takes it: at most MAX_TEXT_CHARS, no control characters
    (but tab and line breaks)."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"a text of {len(text):,} characters; a text may have at most {MAX_TEXT_CHARS:,}"
        )
    bad = next((c for c in text if c in _CONTROL_CHARACTERS), None)
    if bad is not None:
        raise ValueError(
            f"holds the control character {bad!r} at position {text.index(bad)}; remove it"
        )
    return text


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


def check_prompts(prompts: list[str]) -> list[str]:
    """Text prompts as a section takes them: none blank, none over MAX_PROMPT_CHARS."""
    if any(not p.strip() for p in prompts):
        raise ValueError("prompts must not be blank")
    for prompt in prompts:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"the prompt {prompt[:40]!r}... is {len(prompt):,} characters long; a prompt may "
                f"have at most {MAX_PROMPT_CHARS:,} (text models read a few dozen words of it)"
            )
    return prompts
