"""What every section of a project's config shares: strict validation (an unknown key is an
error that names it), bounded numbers, frozen values, and the few value types several sections
use. Each stage declares its own section in its folder (`assets/<stage>/config.py`);
`dataminer_dagster.config` composes them into the project config."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

SAFE_NAME = r"^[A-Za-z0-9_-]{1,64}$"

# The largest number any key may hold. Every number of a config ends up in a call with a limit
# (itertools.islice, socket timeouts, datetime arithmetic, PostgreSQL integer columns), and
# infinity or 10**30 passed validation only to fail there; this bound is inside all of them and
# far above any sensible value (68 years in seconds, 2 PB in MB).
MAX_NUMBER = 2**31 - 1


class ConfigError(ValueError):
    """A project config that cannot be used; the message names the file, the key and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _bounded_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return value
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise ValueError(f"must be a finite number no larger than {MAX_NUMBER:,}")
        return value


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
