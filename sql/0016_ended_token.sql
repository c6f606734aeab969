-- The lease token whose holder's own write (reschedule, retry_failed, park)
-- last ended a lease on this row. After such a write whose answer was lost,
-- the worker asks the row whether its attempt landed (vpay.queue.write_was_made):
-- "unleased" alone could also be a reaper's work, and a reaped lease counted
-- as kept would hide a lost lease from the `lost` counter. A reaper or an
-- operator's release never writes it, so it never names their work; a claim
-- leaves it, since a new lease has a new token (so the answer holds even once
-- another worker has claimed the row). Not indexed: nothing looks a row up by it.
ALTER TABLE jobs ADD COLUMN ended_token uuid;
