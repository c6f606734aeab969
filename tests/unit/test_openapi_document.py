"""The served OpenAPI document is a valid OpenAPI 3.1 document, judged by an
independent validator (openapi-spec-validator), and names every merchant
route of the contract ("Merchant API")."""

from __future__ import annotations

from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from vpay.api.openapi import DOCUMENT

CONTRACT_ROUTES = {
    ("/v1/payment_intents", "post"), ("/v1/payment_intents", "get"), ("/v1/payment_intents/{intent_id}", "get"),
    ("/v1/refunds", "post"), ("/v1/refunds", "get"), ("/v1/refunds/{refund_id}", "get"),
    ("/v1/events", "get"), ("/v1/events/{event_id}", "get"),
    ("/v1/webhook_endpoints", "post"), ("/v1/webhook_endpoints", "get"),
    ("/v1/webhook_endpoints/{endpoint_id}", "get"), ("/v1/webhook_endpoints/{endpoint_id}", "delete"),
    ("/v1/webhook_endpoints/{endpoint_id}/rotate_secret", "post"),
}


def test_the_document_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"] == "3.1.0"
    validate(DOCUMENT)  # raises OpenAPIValidationError when invalid


def test_the_validator_does_refuse_a_broken_document():
    broken = {**DOCUMENT, "paths": {"/v1/x": {"get": {"responses": {"200": {}}}}}}
    try:
        validate(broken)
    except OpenAPIValidationError:
        return
    raise AssertionError("a response without a description was accepted")


def test_every_merchant_route_is_documented_with_auth_and_not_found_errors():
    documented = {(path, method) for path, ops in DOCUMENT["paths"].items() for method in ops}
    assert CONTRACT_ROUTES <= documented
    for path, method in CONTRACT_ROUTES:
        op = DOCUMENT["paths"][path][method]
        assert "401" in op["responses"] and "503" in op["responses"], (path, method)
        assert "security" not in op, (path, method)  # the document's default: the secret key
        if "{" in path or method == "get" and path != "/v1/webhook_endpoints":
            assert "404" in op["responses"], (path, method)
