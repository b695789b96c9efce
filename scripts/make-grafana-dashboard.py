#!/usr/bin/env python3
"""Writes the Grafana dashboards of the rollout service:

- deploy/grafana/rollout.json reads the service's Postgres database through Grafana's
  PostgreSQL data source;
- deploy/grafana/rollout-sqlite.json reads the SQLite database of `rollout up` through
  the SQLite data source plugin (frser-sqlite-datasource), which has no
  `to_timestamp`, `::numeric` or `percentile_cont`: its times are epoch seconds in
  columns the query names as time columns, its time range is Grafana's `$__from` /
  `$__to` (epoch ms), and its percentiles are nearest-rank ones from window functions.

Both carry the same panels over the dashboard views (migrations/*/*dashboard*.sql,
*_result_stats.sql): batches, stage queues, results and mean reward per minute, stage
latency, failures, backends, sandboxes, sampling batches, and the training panels
(episodes and reward by batch, finish reasons, reward by policy version); the Postgres
one adds metric panels over the Prometheus metrics of /metrics. The test suite runs
every SQL panel of each against a real database of its kind (tests/pipeline/views.rs),
so a view change that breaks a panel fails there.

    python3 scripts/make-grafana-dashboard.py            # rewrite the files
    python3 scripts/make-grafana-dashboard.py --check    # fail if one is out of date
"""
import json
import sys
from pathlib import Path

DIR = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
PROM = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# The columns the SQLite plugin turns from epoch seconds into times.
SQLITE_TIME_COLUMNS = ["time", "created", "last", "checked", "oldest"]


class Postgres:
    name = "rollout.json"
    source = {"type": "grafana-postgresql-datasource", "uid": "${DS_POSTGRES}"}
    inputs = [{"name": "DS_POSTGRES", "label": "rollout database", "type": "datasource",
               "pluginId": "grafana-postgresql-datasource", "pluginName": "PostgreSQL"}]

    @staticmethod
    def ms(col):
        """An epoch-milliseconds column as a timestamp."""
        return f"to_timestamp({col} / 1000.0)"

    @staticmethod
    def in_range(col):
        """An epoch-milliseconds column within the dashboard's time range, compared as
        it is stored so that the views' indexes find the range (a `$__timeFilter` over
        a converted column would read every row). Grafana writes its epoch-seconds
        macros as literals, which Postgres reads as 32-bit integers: cast before
        multiplying."""
        return (f"{col} BETWEEN CAST($__unixEpochFrom() AS BIGINT) * 1000 "
                f"AND CAST($__unixEpochTo() AS BIGINT) * 1000")

    @staticmethod
    def start():
        return "CAST($__unixEpochFrom() AS BIGINT) * 1000"

    @staticmethod
    def round(expr, digits):
        return f"round(({expr})::numeric, {digits})"

    @staticmethod
    def latency(where):
        return f"""
        SELECT stage, count(*) AS jobs,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms) AS wait_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY wait_ms) AS wait_p90,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY work_ms) AS work_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY work_ms) AS work_p90,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY work_ms) AS work_p99
        FROM stage_timings WHERE {where}
        GROUP BY stage ORDER BY stage"""

    def target(self, sql, fmt):
        return {"refId": "A", "datasource": self.source, "format": fmt, "rawQuery": True,
                "editorMode": "code", "rawSql": " ".join(sql.split())}


class Sqlite:
    name = "rollout-sqlite.json"
    source = {"type": "frser-sqlite-datasource", "uid": "${DS_SQLITE}"}
    inputs = [{"name": "DS_SQLITE", "label": "rollout database (SQLite file)",
               "type": "datasource", "pluginId": "frser-sqlite-datasource",
               "pluginName": "SQLite"}]

    @staticmethod
    def ms(col):
        """Epoch ms as epoch seconds (a REAL), which the plugin reads as a time in the
        columns named by SQLITE_TIME_COLUMNS."""
        return f"({col} / 1000.0)"

    @staticmethod
    def in_range(col):
        """The plugin replaces `$__from` and `$__to` with the range in epoch ms, as the
        column is stored, so the views' indexes find the range."""
        return f"{col} BETWEEN $__from AND $__to"

    @staticmethod
    def start():
        return "$__from"

    @staticmethod
    def round(expr, digits):
        return f"round({expr}, {digits})"

    @staticmethod
    def latency(where):
        # Nearest-rank percentiles: the q-th is the smallest value whose rank reaches
        # q of the count (SQLite has no percentile_cont; Postgres's interpolates).
        def pct(col, q):
            return f"min(CASE WHEN {col}_rank >= {q} * {col}_n THEN {col} END)"
        return f"""
        SELECT stage, count(*) AS jobs,
               {pct('wait_ms', 0.5)} AS wait_p50, {pct('wait_ms', 0.9)} AS wait_p90,
               {pct('work_ms', 0.5)} AS work_p50, {pct('work_ms', 0.9)} AS work_p90,
               {pct('work_ms', 0.99)} AS work_p99
        FROM (SELECT stage, wait_ms, work_ms,
                     row_number() OVER (PARTITION BY stage ORDER BY wait_ms) AS wait_ms_rank,
                     count(wait_ms) OVER (PARTITION BY stage) AS wait_ms_n,
                     row_number() OVER (PARTITION BY stage ORDER BY work_ms) AS work_ms_rank,
                     count(work_ms) OVER (PARTITION BY stage) AS work_ms_n
              FROM stage_timings WHERE {where}) ranked
        GROUP BY stage ORDER BY stage"""

    def target(self, sql, fmt):
        return {"refId": "A", "datasource": self.source,
                "queryType": "time series" if fmt == "time_series" else "table",
                "queryText": " ".join(sql.split()), "rawQueryText": " ".join(sql.split()),
                "timeColumns": SQLITE_TIME_COLUMNS}


def sql_panel(d, title, kind, sql, pos, fmt="table", description=""):
    x, y, w, h = pos
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": d.source,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [d.target(sql, fmt)],
    }


def prom_panel(title, exprs, pos, unit="short"):
    x, y, w, h = pos
    return {
        "type": "timeseries",
        "title": title,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": PROM, "expr": e, "legendFormat": legend}
            for i, (e, legend) in enumerate(exprs)
        ],
    }


def sql_panels(d):
    results_in_range = d.in_range("(created_at / 60000) * 60000")
    return [
        sql_panel(d, "Batches", "table", f"""
            SELECT batch_id, {d.ms('created_at')} AS created, submitted, finished, in_flight,
                   done, failed, timed_out, cancelled, {d.round('reward_mean', 3)} AS reward_mean
            FROM batch_progress ORDER BY created_at DESC LIMIT 50
            """, (0, 0, 16, 8), description="Batch progress (view batch_progress), newest first."),
        sql_panel(d, "Stage queues", "bargauge", """
            SELECT stage, queued, running FROM stage_queue ORDER BY position
            """, (16, 0, 8, 8), description="Jobs waiting in and held by each stage (view stage_queue)."),
        sql_panel(d, "Results per minute", "timeseries", f"""
            SELECT {d.ms('minute')} AS time, status AS metric, jobs FROM throughput_per_minute
            WHERE {d.in_range('minute')} ORDER BY 1
            """, (0, 8, 12, 8), fmt="time_series",
            description="Finished jobs per minute by final status (view throughput_per_minute)."),
        sql_panel(d, "Mean reward per minute", "timeseries", f"""
            SELECT {d.ms('minute')} AS time, reward_mean AS mean_reward FROM throughput_per_minute
            WHERE status = 'done' AND {d.in_range('minute')} ORDER BY 1
            """, (12, 8, 12, 8), fmt="time_series",
            description="Mean reward of the jobs that ended done, per minute (view throughput_per_minute)."),
        sql_panel(d, "Stage latency (ms)", "table",
            d.latency(f"{d.in_range('finished_at')} AND job_finished_at >= {d.start()}"),
            (0, 16, 12, 8),
            description="Queue wait and work time percentiles of stages finished in the range, of jobs that have ended (view stage_timings)."),
        sql_panel(d, "Failures by reason", "table", f"""
            SELECT status, kind, reason, count(*) AS jobs, {d.ms('max(ended_at)')} AS last,
                   max(job_id) AS example_job_id
            FROM failed_results WHERE {d.in_range('ended_at')}
            GROUP BY status, kind, reason ORDER BY max(ended_at) DESC LIMIT 50
            """, (12, 16, 12, 8),
            description="Failed and timed-out jobs of the range grouped by kind and error, as failures_by_reason groups them (view failed_results)."),
        sql_panel(d, "Episodes and reward by batch", "table", f"""
            SELECT batch_id, count(*) AS results,
                   sum(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS done,
                   {d.round("avg(CASE WHEN status = 'done' THEN reward END)", 3)} AS reward_mean,
                   {d.round('avg(turns)', 2)} AS turns_mean,
                   {d.round('avg(response_tokens)', 0)} AS response_tokens_mean,
                   max(response_tokens) AS response_tokens_max,
                   sum(tool_calls) AS tool_calls, sum(tool_errors) AS tool_errors,
                   {d.ms('max(created_at)')} AS last
            FROM results WHERE {results_in_range}
            GROUP BY batch_id ORDER BY max(created_at) DESC LIMIT 50
            """, (0, 24, 16, 8),
            description="Results of the range per batch: mean reward of the done ones, turns, response lengths and tool calls and errors (the results' summary columns)."),
        sql_panel(d, "Finish reasons", "bargauge", f"""
            SELECT COALESCE(finish_reason, '(' || status || ')') AS finish_reason, count(*) AS jobs
            FROM results WHERE {results_in_range}
            GROUP BY COALESCE(finish_reason, '(' || status || ')') ORDER BY 2 DESC
            """, (16, 24, 8, 8),
            description="Why the range's episodes ended; a result without an episode counts under its status."),
        sql_panel(d, "Reward by policy version", "table", f"""
            SELECT policy_version, count(*) AS results,
                   sum(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS done,
                   {d.round("avg(CASE WHEN status = 'done' THEN reward END)", 3)} AS reward_mean
            FROM results WHERE policy_version IS NOT NULL AND {results_in_range}
            GROUP BY policy_version ORDER BY policy_version DESC LIMIT 50
            """, (0, 32, 8, 8),
            description="Mean reward of the range's results by the oldest policy version of their tokens."),
        sql_panel(d, "Backends", "table", f"""
            SELECT backend_id, model, url, healthy, in_flight, weight, last_error,
                   {d.ms('checked_at')} AS checked FROM backend_load ORDER BY backend_id
            """, (8, 32, 16, 8),
            description="Inference backends: health and RUN jobs assigned now (view backend_load)."),
        sql_panel(d, "Sandboxes", "table", f"""
            SELECT node, backend, sandboxes, {d.ms('oldest_created_at')} AS oldest
            FROM sandbox_counts ORDER BY node, backend
            """, (0, 40, 8, 8), description="Live RUN sandboxes per node (view sandbox_counts)."),
        sql_panel(d, "Dynamic-sampling batches", "table", f"""
            SELECT batch_id, status, informative, target_groups, groups_launched, uniform, incomplete,
                   samples_completed, jobs_saved, sandbox_ms_saved, {d.ms('created_at')} AS created
            FROM sampling_progress ORDER BY created_at DESC LIMIT 20
            """, (8, 40, 16, 8),
            description="Dynamic-sampling batches and their counters (view sampling_progress)."),
    ]


METRIC_PANELS = [
    prom_panel("Jobs finished / s", [
        ("sum by (status) (rate(rollout_jobs_finished_total[1m]))", "{{status}}")], (0, 48, 8, 8), "reqps"),
    prom_panel("Stage duration p90", [
        ("histogram_quantile(0.9, sum by (le, stage) (rate(rollout_stage_duration_seconds_bucket[5m])))",
         "{{stage}}")], (8, 48, 8, 8), "s"),
    prom_panel("Queue wait p90", [
        ("histogram_quantile(0.9, sum by (le, stage) (rate(rollout_queue_wait_seconds_bucket[5m])))",
         "{{stage}}")], (16, 48, 8, 8), "s"),
    prom_panel("Backend load", [
        ("sum by (backend) (rollout_backend_active_jobs)", "{{backend}} active"),
        ("sum by (backend) (rate(rollout_backend_errors_total[5m]))", "{{backend}} errors/s")],
        (0, 56, 12, 8)),
    prom_panel("Sandbox start p90", [
        ("histogram_quantile(0.9, sum by (le, backend) (rate(rollout_sandbox_ready_seconds_bucket[5m])))",
         "{{backend}}")], (12, 56, 12, 8), "s"),
]


def dashboard(d):
    panels = sql_panels(d)
    inputs = list(d.inputs)
    if isinstance(d, Postgres):
        panels += METRIC_PANELS
        inputs.append({"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                       "pluginId": "prometheus", "pluginName": "Prometheus"})
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return {
        "__inputs": inputs,
        "title": "rollout" if isinstance(d, Postgres) else "rollout (SQLite)",
        "uid": "rollout-service" if isinstance(d, Postgres) else "rollout-service-sqlite",
        "description": "Batches, stage queues and latencies, throughput and reward, training "
                       "distributions, failures, backends, sandboxes and dynamic sampling of the "
                       "rollout service (its dashboard views"
                       + (" and metrics)." if isinstance(d, Postgres) else ")."),
        "tags": ["rollout", "rl"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": panels,
    }


stale = []
for dialect in (Postgres(), Sqlite()):
    out = DIR / dialect.name
    text = json.dumps(dashboard(dialect), indent=2) + "\n"
    if "--check" in sys.argv[1:]:
        if not out.exists() or out.read_text() != text:
            stale.append(str(out))
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
if stale:
    sys.exit(f"{', '.join(stale)} out of date: run python3 scripts/make-grafana-dashboard.py")
