-- Policy versions (POST /v1/policy): the trainer announces each version of the weights;
-- the one row of `policy` holds the current one, and `policy_versions` every version
-- announced, for the record. An announcement is a compare-and-set on `policy` (only a
-- newer version replaces it), so concurrent announcers get one order.
CREATE TABLE policy (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER,
    announced_at INTEGER
);
INSERT INTO policy (id, version, announced_at) VALUES (1, NULL, NULL);

CREATE TABLE policy_versions (
    version INTEGER PRIMARY KEY,
    announced_at INTEGER NOT NULL
);
