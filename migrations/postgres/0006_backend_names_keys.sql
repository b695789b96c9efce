-- What a backend needs beyond its URL once real servers are behind it: the name the
-- server serves the model under when it differs from the pool's model name (vLLM's
-- --served-model-name), the server's API key (sent as a Bearer token; never returned by
-- the API, so dashboards must not show this column), and which logprobs it returns
-- (`raw` or `processed`; NULL for the server kind's default).
ALTER TABLE backends ADD COLUMN served_model_name TEXT;
ALTER TABLE backends ADD COLUMN api_key TEXT;
ALTER TABLE backends ADD COLUMN logprobs_mode TEXT;
