-- Speed II (issue 30): a charge's settle is one statement (charge_settle in
-- sql/queries/money.sql): the compare-and-swap on the charge, its intent, the
-- one event and that event's deliveries with their deliver jobs. The event's
-- JSON is then built in SQL, and two helpers keep it what the Python views
-- write (vpay.money.charges.intent_view, charge_view).

-- A time as the views write it: datetime.isoformat() of the value psycopg
-- hands back, which is in the session's TimeZone: seconds, then microseconds
-- only when there are any, then the offset as +HH:MM
-- ("2026-12-05T06:54:20.664123+00:00", "2026-12-05T06:54:20+00:00").
-- NULL stays NULL (a JSON null). STABLE: it reads the session's TimeZone.
CREATE FUNCTION iso_8601(t timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_char(t, 'YYYY-MM-DD"T"HH24:MI:SS')
           || CASE WHEN extract(microseconds FROM t)::bigint % 1000000 <> 0
                   THEN to_char(t, '.US') ELSE '' END
           || to_char(t, 'TZH:TZM')
$$;

-- Fails the statement that calls it (and so its transaction) with
-- `message`: what a one-statement write answers when it finds what only a
-- bug or a hash collision can make (charge_settle: an event id taken by
-- another transition). Never answers.
CREATE FUNCTION vpay_refuse(message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = message, ERRCODE = 'VP001';
END
$$;
