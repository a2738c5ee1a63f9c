//! The analyst's four usual questions, as SQL over the store: each once against the derived
//! columns and rollups (what the schema is indexed for) and once against raw spans only (the
//! reference a user without the rollups would write). Tests check both agree; the benchmark
//! times both.

/// Error rate by tool, from the `trace_tools` rollup. Columns: tool_name, calls, errors,
/// error_rate.
pub const ERROR_RATE_BY_TOOL: &str = "\
SELECT tool_name, SUM(calls) AS calls, SUM(errors) AS errors,
       ROUND(1.0 * SUM(errors) / SUM(calls), 4) AS error_rate
FROM trace_tools
GROUP BY tool_name
ORDER BY error_rate DESC, tool_name";

/// Error rate by tool, from raw spans.
pub const ERROR_RATE_BY_TOOL_RAW: &str = "\
SELECT tool_name, COUNT(*) AS calls, SUM(is_error) AS errors,
       ROUND(1.0 * SUM(is_error) / COUNT(*), 4) AS error_rate
FROM spans
WHERE tool_name IS NOT NULL
GROUP BY tool_name
ORDER BY error_rate DESC, tool_name";

/// The 5 slowest traces. Columns: trace_id, latency_ns, span_count, status.
pub const SLOWEST_TRACES: &str = "\
SELECT trace_id, latency_ns, span_count, status
FROM traces
WHERE latency_ns IS NOT NULL
ORDER BY latency_ns DESC, trace_id
LIMIT 5";

/// The 5 slowest traces, from raw spans.
pub const SLOWEST_TRACES_RAW: &str = "\
SELECT trace_id, MAX(COALESCE(end_time_ns, start_time_ns)) - MIN(start_time_ns) AS latency_ns,
       COUNT(*) AS span_count, NULL AS status
FROM spans
GROUP BY trace_id
HAVING latency_ns IS NOT NULL
ORDER BY latency_ns DESC, trace_id
LIMIT 5";

/// Traces with 5 or more consecutive calls of the same tool (other tools interrupt a run; LLM
/// and agent spans do not). Columns: trace_id, tool_name, max_consecutive.
pub const REPEATED_TOOL_RUNS: &str = "\
SELECT trace_id, tool_name, max_consecutive
FROM trace_tools
WHERE max_consecutive >= 5
ORDER BY trace_id, tool_name";

/// Repeated tool runs from raw spans (gaps and islands over the tool calls in `seq` order).
pub const REPEATED_TOOL_RUNS_RAW: &str = "\
WITH calls AS (
  SELECT trace_id, tool_name,
         ROW_NUMBER() OVER (PARTITION BY trace_id ORDER BY seq)
       - ROW_NUMBER() OVER (PARTITION BY trace_id, tool_name ORDER BY seq) AS island
  FROM spans
  WHERE tool_name IS NOT NULL
), runs AS (
  SELECT trace_id, tool_name, COUNT(*) AS run FROM calls GROUP BY trace_id, tool_name, island
)
SELECT trace_id, tool_name, MAX(run) AS max_consecutive
FROM runs
GROUP BY trace_id, tool_name
HAVING MAX(run) >= 5
ORDER BY trace_id, tool_name";

/// Failed spans within the last 5 steps of their trace (steps `max_step - 4 ..= max_step`).
/// Columns: trace_id, step, span_id, name, error_type. `CROSS JOIN` makes SQLite walk the
/// traces and seek each one's last steps in the `spans_errors (trace_id, step)` index.
pub const ERRORS_IN_LAST_STEPS: &str = "\
SELECT s.trace_id, s.step, s.span_id, s.name, s.error_type
FROM traces AS t CROSS JOIN spans AS s
WHERE s.trace_id = t.trace_id AND s.is_error = 1 AND s.step > t.max_step - 5
ORDER BY s.trace_id, s.step, s.seq";

/// Failed spans within the last 5 steps, from raw spans.
pub const ERRORS_IN_LAST_STEPS_RAW: &str = "\
WITH last AS (SELECT trace_id, MAX(step) AS max_step FROM spans GROUP BY trace_id)
SELECT s.trace_id, s.step, s.span_id, s.name, s.error_type
FROM spans AS s JOIN last ON last.trace_id = s.trace_id
WHERE s.is_error = 1 AND s.step IS NOT NULL AND s.step > last.max_step - 5
ORDER BY s.trace_id, s.step, s.seq";

/// Every query: (name, indexed form, raw-span form).
pub const ALL: [(&str, &str, &str); 4] = [
    (
        "error rate by tool",
        ERROR_RATE_BY_TOOL,
        ERROR_RATE_BY_TOOL_RAW,
    ),
    ("5 slowest traces", SLOWEST_TRACES, SLOWEST_TRACES_RAW),
    (
        "5+ consecutive calls of one tool",
        REPEATED_TOOL_RUNS,
        REPEATED_TOOL_RUNS_RAW,
    ),
    (
        "errors in the last 5 steps",
        ERRORS_IN_LAST_STEPS,
        ERRORS_IN_LAST_STEPS_RAW,
    ),
];
