"""The OpenAPI schema tells the truth about errors: every operation documents the error responses the API can
give it, all in the one error format of portal.api_support."""

from __future__ import annotations

from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True)
    limit = serializers.JSONField(required=False, allow_null=True)
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


_WHY = {
    "400": "Refused input: `error.field` names the field, `error.limit` the bound where there is one.",
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
