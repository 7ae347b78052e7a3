"""The base of every spec type."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from llmgw.spec import identifiers


class Strict(BaseModel):
    """Base for every spec type: unknown keys are errors, values are frozen.

    Every string, free text included, is checked for what no unit can carry
    (:func:`llmgw.spec.identifiers.check_text`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("*", mode="after")
    @classmethod
    def _text(cls, value: object) -> object:
        return identifiers.check_text(value)
