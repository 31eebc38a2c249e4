"""The value types the ``length_penalty`` keys are made of (docs/reference/length-penalties.md §2.1): numbers
that reject booleans, counts and the three length channels (§2.5). Needs only pydantic: the term modules
declare their keys with these types, and the config assembles its model from them before torch is
imported."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from trl_length_plugin.config_base import not_bool

Channel = Literal["total", "reasoning", "answer"]
CHANNELS: tuple[Channel, ...] = ("reasoning", "answer", "total")  # bonus / longest / zMAD order (§2.7)
BAND_CHANNELS: tuple[Channel, ...] = ("total", "reasoning", "answer")  # band order (§2.12)


#: the largest length (and count) a key takes: larger lengths are absurd, and their sums of squares lose
#: exactness (docs/reference/length-penalties.md §2.1)
MAX_LENGTH = 2.0**53
#: the largest magnitude of a float key that is not a length: its products with lengths up to ``MAX_LENGTH``,
#: and their sums over the terms, stay finite in float32 (docs/reference/length-penalties.md §2.1)
MAX_WEIGHT = 1e6

Number = Annotated[float, BeforeValidator(not_bool)]  # finite; a schedule's stage value, checked by its key
Bounded = Annotated[float, Field(ge=-MAX_WEIGHT, le=MAX_WEIGHT), BeforeValidator(not_bool)]
NonNegative = Annotated[float, Field(ge=0, le=MAX_WEIGHT), BeforeValidator(not_bool)]
Fraction = Annotated[float, Field(ge=0, le=1), BeforeValidator(not_bool)]
Count = Annotated[int, Field(ge=0, le=MAX_LENGTH), BeforeValidator(not_bool)]
Positive = Annotated[float, Field(gt=0, le=MAX_WEIGHT), BeforeValidator(not_bool)]
PositiveCount = Annotated[int, Field(ge=1, le=MAX_LENGTH), BeforeValidator(not_bool)]
