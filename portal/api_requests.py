"""Request bodies: a serializer that takes only the fields it names. A field it does not name (a typo such as
`guaranteed_gpu`) is refused with a 400 naming it, not ignored with a 200 that changed nothing; the schema says so
(`additionalProperties: false`, portal.api_schema)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class RequestSerializer(serializers.Serializer):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            taken = [name for name, field in self.fields.items() if not field.read_only]
            unknown = next((str(key) for key in data if key not in taken), None)
            if unknown is not None:
                name = unknown if len(unknown) <= 64 else f"{unknown[:61]}..."
                raise serializers.ValidationError(
                    {name: [f"{name} is not a field of this request; it takes: {', '.join(taken)}."]}
                )
        return super().to_internal_value(data)
