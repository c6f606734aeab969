-- Secrets at rest (issue #27; docs/security.md, "A database reader").
--
-- A webhook endpoint's signing secrets are stored sealed with Fernet under
-- the operator's VPAY_SECRET_KEYS (vpay/base/secretbox.py): 'fernet:<token>'.
-- SQL cannot seal (the key never reaches the database), so this migration
-- only lets the columns hold sealed values; the rows written before it keep
-- their plaintext 'whsec_…' value, and that prefix is their mark: `vpay-server
-- migrate` seals them right after applying this file when the keys are set,
-- and `vpay-server secrets rotate` seals whatever is left. Until then the
-- worker reads a plaintext row as it always did.
ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_secret_check,
    DROP CONSTRAINT webhook_endpoints_previous_secret_check,
    ADD CONSTRAINT webhook_endpoints_secret_check
        CHECK (secret ~ '^(whsec_|fernet:)'),
    ADD CONSTRAINT webhook_endpoints_previous_secret_check
        CHECK (previous_secret ~ '^(whsec_|fernet:)');
