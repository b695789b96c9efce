#!/usr/bin/env python3
"""Writes deploy/grafana/rollout.json, the Grafana dashboard of the rollout service.

Its SQL panels read the dashboard views (migrations/*/0009_dashboard_views.sql and
*_bounded_dashboard.sql) through
a Postgres data source; its metric panels read the Prometheus metrics the gateway and
workers export at /metrics. Both data sources are import-time inputs. The dashboard's
SQL is run against a real database by the test suite (tests/pipeline/views.rs), so a
view change that breaks a panel fails there.

    python3 scripts/make-grafana-dashboard.py            # rewrite the file
    python3 scripts/make-grafana-dashboard.py --check    # fail if it is out of date
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "rollout.json"
PG = {"type": "grafana-postgresql-datasource", "uid": "${DS_POSTGRES}"}
PROM = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def ms(col):
    """An epoch-milliseconds column as a timestamp."""
    return f"to_timestamp({col} / 1000.0)"


def in_range(col):
    """An epoch-milliseconds column within the dashboard's time range, compared as it is
    stored so that the views' indexes find the range (a `$__timeFilter` over a converted
    column would read every row)."""
    return f"{col} BETWEEN {epoch_ms('$__unixEpochFrom()')} AND {epoch_ms('$__unixEpochTo()')}"


def epoch_ms(seconds):
    """Grafana's epoch-seconds macro as milliseconds (Grafana writes the seconds as a
    literal, which Postgres reads as a 32-bit integer: times 1000 it would overflow)."""
    return f"CAST({seconds} AS BIGINT) * 1000"


def sql_panel(title, kind, sql, x, y, w, h, fmt="table", description=""):
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PG,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            {"refId": "A", "datasource": PG, "format": fmt, "rawQuery": True,
             "editorMode": "code", "rawSql": " ".join(sql.split())}
        ],
    }


def prom_panel(title, exprs, x, y, w, h, unit="short"):
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


panels = [
    sql_panel("Batches", "table", """
        SELECT batch_id, {created} AS created, submitted, finished, in_flight, done, failed,
               timed_out, cancelled, round(reward_mean::numeric, 3) AS reward_mean
        FROM batch_progress ORDER BY created_at DESC LIMIT 50
        """.format(created=ms("created_at")), 0, 0, 16, 8,
        description="Batch progress (view batch_progress), newest first."),
    sql_panel("Stage queues", "bargauge", """
        SELECT stage, queued, running FROM stage_queue ORDER BY position
        """, 16, 0, 8, 8, description="Jobs waiting in and held by each stage (view stage_queue)."),
    sql_panel("Results per minute", "timeseries", """
        SELECT {minute} AS time, status AS metric, jobs FROM throughput_per_minute
        WHERE {range} ORDER BY 1
        """.format(minute=ms("minute"), range=in_range("minute")), 0, 8, 12, 8, fmt="time_series",
        description="Finished jobs per minute by final status (view throughput_per_minute)."),
    sql_panel("Stage latency (ms)", "table", """
        SELECT stage, count(*) AS jobs,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms) AS wait_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY wait_ms) AS wait_p90,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY work_ms) AS work_p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY work_ms) AS work_p90,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY work_ms) AS work_p99
        FROM stage_timings WHERE {range} AND job_finished_at >= {start}
        GROUP BY stage ORDER BY stage
        """.format(range=in_range("finished_at"), start=epoch_ms("$__unixEpochFrom()")), 12, 8, 12, 8,
        description="Queue wait and work time percentiles of stages finished in the range, of jobs that have ended (view stage_timings)."),
    sql_panel("Failures by reason", "table", """
        SELECT status, kind, reason, count(*) AS jobs, {last} AS last, max(job_id) AS example_job_id
        FROM failed_results WHERE {range}
        GROUP BY status, kind, reason ORDER BY max(ended_at) DESC LIMIT 50
        """.format(last=ms("max(ended_at)"), range=in_range("ended_at")), 0, 16, 16, 8,
        description="Failed and timed-out jobs of the range grouped by kind and error, as failures_by_reason groups them (view failed_results)."),
    sql_panel("Backends", "table", """
        SELECT backend_id, model, url, healthy, in_flight, weight, last_error,
               {checked} AS checked FROM backend_load ORDER BY backend_id
        """.format(checked=ms("checked_at")), 16, 16, 8, 8,
        description="Inference backends: health and RUN jobs assigned now (view backend_load)."),
    sql_panel("Sandboxes", "table", """
        SELECT node, backend, sandboxes, {oldest} AS oldest FROM sandbox_counts ORDER BY node, backend
        """.format(oldest=ms("oldest_created_at")), 0, 24, 8, 8,
        description="Live RUN sandboxes per node (view sandbox_counts)."),
    sql_panel("Dynamic-sampling batches", "table", """
        SELECT batch_id, status, informative, target_groups, groups_launched, uniform, incomplete,
               samples_completed, jobs_saved, sandbox_ms_saved, {created} AS created
        FROM sampling_progress ORDER BY created_at DESC LIMIT 20
        """.format(created=ms("created_at")), 8, 24, 16, 8,
        description="Dynamic-sampling batches and their counters (view sampling_progress)."),
    prom_panel("Jobs finished / s", [
        ("sum by (status) (rate(rollout_jobs_finished_total[1m]))", "{{status}}")], 0, 32, 8, 8, "reqps"),
    prom_panel("Stage duration p90", [
        ("histogram_quantile(0.9, sum by (le, stage) (rate(rollout_stage_duration_seconds_bucket[5m])))",
         "{{stage}}")], 8, 32, 8, 8, "s"),
    prom_panel("Queue wait p90", [
        ("histogram_quantile(0.9, sum by (le, stage) (rate(rollout_queue_wait_seconds_bucket[5m])))",
         "{{stage}}")], 16, 32, 8, 8, "s"),
    prom_panel("Backend load", [
        ("sum by (backend) (rollout_backend_active_jobs)", "{{backend}} active"),
        ("sum by (backend) (rate(rollout_backend_errors_total[5m]))", "{{backend}} errors/s")],
        0, 40, 12, 8),
    prom_panel("Sandbox start p90", [
        ("histogram_quantile(0.9, sum by (le, backend) (rate(rollout_sandbox_ready_seconds_bucket[5m])))",
         "{{backend}}")], 12, 40, 12, 8, "s"),
]
for i, p in enumerate(panels, start=1):
    p["id"] = i

dashboard = {
    "__inputs": [
        {"name": "DS_POSTGRES", "label": "rollout database", "type": "datasource",
         "pluginId": "grafana-postgresql-datasource", "pluginName": "PostgreSQL"},
        {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
         "pluginId": "prometheus", "pluginName": "Prometheus"},
    ],
    "title": "rollout",
    "uid": "rollout-service",
    "description": "Batches, stage queues and latencies, throughput, failures, backends, sandboxes "
                   "and dynamic sampling of the rollout service (its dashboard views and metrics).",
    "tags": ["rollout", "rl"],
    "timezone": "browser",
    "schemaVersion": 39,
    "version": 1,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    "panels": panels,
}

text = json.dumps(dashboard, indent=2) + "\n"
if "--check" in sys.argv[1:]:
    if not OUT.exists() or OUT.read_text() != text:
        sys.exit(f"{OUT} is out of date: run python3 scripts/make-grafana-dashboard.py")
else:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
