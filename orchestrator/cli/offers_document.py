"""``gpuq offers --json``'s document (registered in cli/documents.py; schema docs/schemas/offers.schema.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OfferEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provider: str
    gpu_type: str = Field(description="What `gpuq up --gpu` takes for it.")
    name: str = Field(description="The provider's words for it.")
    gpus: int
    gpu_memory_gb: int | None = Field(description="Per GPU, as the provider states it; null: not stated.")
    price_per_hour: float = Field(description="US dollars per machine-hour: on demand, or the spot minimum "
                                              "with --spot.")
    price_per_gpu_hour: float | None
    spot: bool
    regions: list[str]


class OffersDocument(BaseModel):
    """`gpuq offers --json`: offers cheapest first; providers not asked (`skipped`) and failing (`failed`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["gpuq.cli.offers/1"] = Field(alias="schema")
    offers: list[OfferEntry]
    skipped: dict[str, str] = Field(description="Provider -> why it was not asked (no API key, no spot).")
    failed: dict[str, str] = Field(description="Provider -> the error its offers call ended with.")
