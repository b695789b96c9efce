-- The text the dashboard views were last made from (migrations/views.sql, which the
-- store applies after the migrations): the store makes them again only when the file
-- it was built with differs. One row.
CREATE TABLE managed_views (
    definition TEXT NOT NULL,
    made_at BIGINT NOT NULL
);
