"""Base class for parameter sections: unknown keys are errors, values are checked strictly."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
