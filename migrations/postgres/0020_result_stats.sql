-- What a training run charts, per result, in columns of their own: the episode's
-- finish reason, turns, response length, tool calls and tool errors, and its oldest
-- policy version. They are read from the RUN output when the result is written (the
-- results table's INSERTs), so the training view and Grafana group results without
-- parsing each trajectory again. Shell and synthetic results leave them NULL. The same
-- change as SQLite's migration 0018.
ALTER TABLE results ADD COLUMN finish_reason TEXT,
    ADD COLUMN turns BIGINT,
    ADD COLUMN response_tokens BIGINT,
    ADD COLUMN tool_calls BIGINT,
    ADD COLUMN tool_errors BIGINT,
    ADD COLUMN policy_version BIGINT;

-- Results written before this migration get theirs from their output.
UPDATE results SET
    finish_reason = output::json -> 'run' ->> 'finish_reason',
    turns = CASE WHEN json_typeof(output::json -> 'run' -> 'turns') = 'array'
                 THEN json_array_length(output::json -> 'run' -> 'turns') END,
    response_tokens = CASE WHEN json_typeof(output::json -> 'run' -> 'response_ids') = 'array'
                 THEN json_array_length(output::json -> 'run' -> 'response_ids') END,
    tool_calls = CASE WHEN json_typeof(output::json -> 'run' -> 'tool_calls') = 'number'
                 THEN (output::json -> 'run' ->> 'tool_calls')::numeric::bigint END,
    tool_errors = CASE WHEN json_typeof(output::json -> 'run' -> 'tool_errors') = 'number'
                 THEN (output::json -> 'run' ->> 'tool_errors')::numeric::bigint END,
    policy_version = CASE WHEN json_typeof(output::json -> 'run' -> 'policy_version_oldest') = 'number'
                 THEN (output::json -> 'run' ->> 'policy_version_oldest')::numeric::bigint END
WHERE json_typeof(output::json -> 'run') = 'object';

CREATE INDEX results_policy_version ON results (policy_version) WHERE policy_version IS NOT NULL;

-- One row per batch with results: mean reward of its scored results, and the means and
-- sums a training run follows from batch to batch.
CREATE VIEW training_by_batch AS
SELECT batch_id,
       MIN(created_at) AS first_result_at,
       MAX(created_at) AS last_result_at,
       COUNT(*) AS results,
       CAST(SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS BIGINT) AS done,
       AVG(CASE WHEN status = 'done' THEN reward END) AS reward_mean,
       AVG(CAST(turns AS DOUBLE PRECISION)) AS turns_mean,
       AVG(CAST(response_tokens AS DOUBLE PRECISION)) AS response_tokens_mean,
       MAX(response_tokens) AS response_tokens_max,
       CAST(SUM(tool_calls) AS BIGINT) AS tool_calls,
       CAST(SUM(tool_errors) AS BIGINT) AS tool_errors
FROM results
GROUP BY batch_id;

-- Results per batch, status and finish reason (NULL for results without an episode).
CREATE VIEW finish_reasons_by_batch AS
SELECT batch_id, status, finish_reason, COUNT(*) AS jobs
FROM results
GROUP BY batch_id, status, finish_reason;

-- Mean reward per policy version (the oldest version of each result's tokens).
CREATE VIEW reward_by_policy_version AS
SELECT policy_version,
       COUNT(*) AS results,
       CAST(SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS BIGINT) AS done,
       AVG(CASE WHEN status = 'done' THEN reward END) AS reward_mean,
       MIN(created_at) AS first_result_at,
       MAX(created_at) AS last_result_at
FROM results
WHERE policy_version IS NOT NULL
GROUP BY policy_version;
