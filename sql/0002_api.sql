-- The HTTP API (vpay/api): merchant API keys and Idempotency-Key records.

-- A merchant's secret key is shown once (`vpay-server merchants create`) and
-- stored only as sha256 of the whole key string: the key carries ~190 bits of
-- randomness, so a plain hash is enough (no password stretching needed). The
-- key string embeds `id` (sk_<id without "key_">_<secret>), so authentication
-- is a primary-key lookup followed by a constant-time comparison.
CREATE TABLE merchant_api_keys (
    id            text        PRIMARY KEY CHECK (id ~ '^key_[A-Za-z0-9]{16}$'),
    merchant_id   text        NOT NULL REFERENCES merchants (id) ON DELETE CASCADE,
    secret_sha256 bytea       NOT NULL CHECK (length(secret_sha256) = 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
CREATE INDEX merchant_api_keys_merchant ON merchant_api_keys (merchant_id);

-- One row per (merchant, Idempotency-Key) of POST /v1/payment_intents, kept
-- 24 h from created_at (query delete_expired_idempotency_keys). The row is
-- inserted "in progress" (status_code NULL) in its own transaction before the
-- intent is created, so the primary key lets exactly one of two concurrent
-- requests create. payment_intent_id is chosen before the intent exists, so a
-- request that died half-way can be recovered: the intent either exists under
-- that id or was never committed.
CREATE TABLE idempotency_keys (
    merchant_id       text        NOT NULL REFERENCES merchants (id) ON DELETE CASCADE,
    key               text        NOT NULL CHECK (key ~ '^[\x21-\x7e]{1,255}$'),
    request_sha256    text        NOT NULL CHECK (request_sha256 ~ '^[0-9a-f]{64}$'),
    payment_intent_id text        NOT NULL CHECK (payment_intent_id ~ '^pi_[A-Za-z0-9]+$'),
    status_code       integer     CHECK (status_code BETWEEN 200 AND 599),
    response_body     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- when the current in-progress attempt started; an attempt older than the
    -- API's stale limit is presumed dead and may be taken over
    locked_at         timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    PRIMARY KEY (merchant_id, key),
    CONSTRAINT idempotency_keys_complete_whole CHECK (
        (status_code IS NULL) = (response_body IS NULL)
        AND (status_code IS NULL) = (completed_at IS NULL))
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
