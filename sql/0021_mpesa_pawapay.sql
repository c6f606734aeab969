-- Two more rails through the one port (issue 29): M-Pesa Daraja (`mpesa`)
-- and pawaPay (`pawapay`). Each is a rail a charge, a refund and a statement
-- may name, and a lane (vpay/money/lanes.py registers one per
-- vpay.rails.port.KNOWN_RAILS; a lane no CHECK knows would be refused here).
ALTER TABLE charges DROP CONSTRAINT charges_rail_check;
ALTER TABLE charges ADD CONSTRAINT charges_rail_check
    CHECK (rail IN ('mtn', 'orange', 'mpesa', 'pawapay'));

ALTER TABLE refunds DROP CONSTRAINT refunds_rail_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_rail_check
    CHECK (rail IN ('mtn', 'orange', 'mpesa', 'pawapay'));

ALTER TABLE statements DROP CONSTRAINT statements_rail_check;
ALTER TABLE statements ADD CONSTRAINT statements_rail_check
    CHECK (rail IN ('mtn', 'orange', 'mpesa', 'pawapay'));

ALTER TABLE jobs DROP CONSTRAINT jobs_lane_known;
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_known
    CHECK (lane IN ('mtn', 'orange', 'mpesa', 'pawapay', 'webhooks', 'housekeeping'));
