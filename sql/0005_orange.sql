-- Orange Money Web Payment (vpay/rails/orange.py; docs/flows/orange.md).
--
-- rail_data: what a rail handed back at submission and its status query
-- needs later, as a JSON object of strings. Orange: pay_token (the status
-- query's key) and payment_url (where the payer is sent). Empty for MTN.
--
-- notif_token_sha256: lower-case hex SHA-256 of Orange's notif_token, the
-- only proof that a notification to our notif_url comes from Orange
-- (design/rails.md). The token itself is never stored: the callback route
-- hashes what it receives and compares the hex strings in constant time.
ALTER TABLE charges
    ADD COLUMN rail_data jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT charges_rail_data_object CHECK (jsonb_typeof(rail_data) = 'object'),
    ADD COLUMN notif_token_sha256 text
        CONSTRAINT charges_notif_token_sha256_hex CHECK (notif_token_sha256 ~ '^[0-9a-f]{64}$');
