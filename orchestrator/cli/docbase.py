"""What every ``--json`` document model of ``cli/documents.py`` stands on: the base model, a host's open parts, and
the names of job states, severities and providers."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema

from orchestrator.providers import registry

JobStateName = Literal["QUEUED", "ASSIGNED", "RUNNING", "SUCCEEDED", "FAILED", "PREEMPTED", "LOST", "CANCELLED",
                       "STOPPED"]
Severity = Literal["info", "warn", "escalate"]


def known_provider(value: str) -> str:
    if value and value not in registry.names():
        raise ValueError(f"{value!r} is not a provider gpuq knows ({', '.join(registry.names())})")
    return value


# The providers of the registry (orchestrator/providers/registry.py): the schema lists gpuq's own, a document
# also accepts one a plugin added (GPUQ_PROVIDER_PLUGINS).
ProviderName = Annotated[str, AfterValidator(known_provider),
                         WithJsonSchema({"enum": ["", *registry.builtin_names()], "type": "string"})]


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document; parts the agent left out (a failed probe's ``slots``) stay out."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def dump(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True) + "\n"


class OpenPart(BaseModel):
    """A part the host agent reports: known fields typed, others passed through."""

    model_config = ConfigDict(extra="allow")
