"""The OpenAPI schema tells the truth about errors: every operation documents the error responses the API can
give it, all in the one error format of portal.api_support."""

from __future__ import annotations

from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from portal.api_params import text_pattern, trimmed_text_pattern
from portal.api_requests import RequestSerializer


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True)
    limit = serializers.JSONField(required=False, allow_null=True)
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


# The codes of a 400 for a request every part of which the schema allows: what no schema can state. Any other 400
# (code `invalid`, mostly) is for input the schema itself refuses.
RULE_CODES = {
    "out_of_range": "a quantity as written (20TiB, 0s, a digit string) beyond the bound `error.limit` names",
    "incompatible": "fields that do not go together (a field under two names, whole GPUs and a slice, since not "
    "before until)",
    "cannot_run": "this cluster can never run it (no such GPU model, more GPUs than any node has)",
    "bad_dependency": "a dependency on a job that does not exist or is not yours to see, a job named twice, or one "
    "that has already ended so it could never be met",
    "not_an_array": "an array's tasks named for a job that is not an array",
    "array_syntax": "a job array's tasks written wrong (they are 0-99, 0-99:10 or 1,3,8, then optionally %N)",
    "unknown_priority": "no priority class of that name",
    "priority_not_granted": "the team may not use that priority class",
    "beyond_team_limit": "more than the team may ever hold",
    "image_not_allowed": "an image outside the team's allowed images",
    "unknown_mount": "a mount the team does not have",
    "too_many_tokens": "the user already holds as many live tokens as one may",
    "unknown_gpu_model": "no GPU model of that name",
    "quota_rule": "a quota that breaks a rule between its fields (a limit below its guarantee)",
    "required": "a value that may not be left out or blank (a quota change's reason)",
    "destination_not_allowed": "a webhook the server will not call: not https, no host, or an address that is not "
    "public (loopback, private, link-local, reserved), unless the site allows the host",
}

_WHY = {
    "400": "Refused input: `error.field` names the field, `error.limit` the bound where there is one. "
    "`error.code` is `invalid` for input this schema refuses; for a request the schema allows, one of: "
    + "; ".join(f"`{code}`: {why}" for code, why in RULE_CODES.items())
    + ".",
    "401": "No valid credentials (a bearer token or a session).",
    "403": "Signed in, but not allowed to do this.",
    "404": "No such object (or not yours to see), or a page past the end of a list.",
    "405": "The method is not allowed here.",
    "406": "No acceptable response format.",
    "409": "In conflict with the object's state (or a reused Idempotency-Key).",
    "415": "The body's media type is not accepted.",
    "429": "Too many requests: throttled, or a sign-in locked out for a while.",
}


class TesseraAutoSchema(AutoSchema):
    _direction = "response"

    def _map_basic_serializer(self, serializer, direction):
        outer, self._direction = self._direction, direction
        try:
            schema = super()._map_basic_serializer(serializer, direction)
        finally:
            self._direction = outer
        if direction == "request" and isinstance(serializer, RequestSerializer):
            schema["additionalProperties"] = False  # it refuses a field it does not name
        return schema

    def _insert_field_validators(self, field, schema):
        """Text a serializer takes, as DRF's CharField reads it: no NUL, and trimmed (unless told not to) before
        its length is counted and a blank one refused."""
        had_pattern = "pattern" in schema
        super()._insert_field_validators(field, schema)
        if (
            self._direction == "request"
            and isinstance(field, serializers.CharField)
            and not field.read_only
            and schema.get("type") == "string"
            and not had_pattern
            and "pattern" not in schema
            and "format" not in schema
        ):
            if field.trim_whitespace:
                schema.pop("minLength", None)
                schema.pop("maxLength", None)
                schema["pattern"] = trimmed_text_pattern(
                    min_length=field.min_length, max_length=field.max_length, blank=field.allow_blank
                )
            else:
                schema["pattern"] = text_pattern(blank=True)

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = ["400", "401", "403", "404", "405", "406", "429"]
        if self.method in ("POST", "PUT", "PATCH"):
            codes += ["409", "415"]
        for code in codes:
            if code not in responses:
                response = self._get_response_for_code(ErrorSerializer, code, direction=direction)
                response["description"] = _WHY[code]
                responses[code] = response
        return responses


class StrictFilterExtension(DjangoFilterExtension):
    """Query parameters of the list filters as portal.api_params reads them: a filter that carries a
    `query_schema` (text without NUL, strict booleans, ids, moments) is documented with exactly that schema."""

    target_class = "portal.api_params.FilterBackend"
    priority = 1

    def resolve_filter_field(self, auto_schema, model, filterset_class, field_name, filter_field):
        parameters = super().resolve_filter_field(
            auto_schema, model, filterset_class, field_name, filter_field
        )
        schema = getattr(filter_field, "query_schema", None)
        if schema is not None:
            for parameter in parameters:
                parameter["schema"] = dict(schema)
        return parameters
