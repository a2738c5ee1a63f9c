//! Schema discovery: a prompt-sized description of a trace store — tables and columns, value
//! distributions, attribute keys and a few sample rows with long values clipped and secrets
//! redacted — within a character budget.
//!
//! It reads only `traces`, `spans`, `trace_tools` and any other non-hidden table, never
//! `labels` (ground truth) or `meta`, so it works on a connection whose authorizer denies the
//! label table.

use rusqlite::types::ValueRef;
use rusqlite::Connection;

use crate::error::Result;
use crate::redact::prompt_safe;

/// Tables discovery never mentions: ground truth and bookkeeping.
pub const HIDDEN_TABLES: &[&str] = &["labels", "meta"];

/// Columns that discovery, exports and the Detector never show, as (table, column).
/// `traces.source` is the path a trace was imported from, and a generated corpus names its
/// episode directories after their ground truth.
pub const HIDDEN_COLUMNS: &[(&str, &str)] = &[("traces", "source")];

/// Whether `table.column` is one of [`HIDDEN_COLUMNS`].
pub fn is_hidden_column(table: &str, column: &str) -> bool {
    HIDDEN_COLUMNS
        .iter()
        .any(|(t, c)| t.eq_ignore_ascii_case(table) && c.eq_ignore_ascii_case(column))
}

/// How long one sample value may be in the rendering.
const SAMPLE_VALUE_CHARS: usize = 72;
/// How many values each distribution lists.
const TOP_VALUES: usize = 8;
/// How many spans the attribute-key census reads (json_each over every span would be slow).
const ATTRIBUTE_SAMPLE: usize = 2000;

/// One line of description per known table.
fn describe(table: &str) -> &'static str {
    match table {
        "traces" => "one row per trace; all columns but attributes are derived at import",
        "spans" => "one row per span; attributes is the producer's JSON object",
        "events" => {
            "a view: each span as a framework-neutral event (llm_call, tool_call, agent_turn, retrieval, validation, retry, workflow, other) with its error family"
        }
        "trace_tools" => {
            "per trace and tool: calls, errors, total duration, longest run of consecutive calls"
        }
        _ => "",
    }
}

/// Renders the description in at most `budget_chars` characters (Unicode scalar values).
/// Sections come in priority order and are cut line by line when the budget runs out.
pub fn discover(conn: &Connection, budget_chars: usize) -> Result<String> {
    let tables = visible_tables(conn)?;
    let mut sections: Vec<Vec<String>> = Vec::new();

    let mut table_lines = vec!["## Tables (SQLite)".to_string()];
    for table in &tables {
        let columns = columns(conn, table)?;
        let count: i64 = conn.query_row(&format!("SELECT COUNT(*) FROM \"{table}\""), [], |r| {
            r.get(0)
        })?;
        let note = describe(table);
        table_lines.push(format!(
            "{table} ({count} rows{}{note}): {}",
            if note.is_empty() { "" } else { "; " },
            columns.join(", ")
        ));
    }
    sections.push(table_lines);

    let has = |t: &str| tables.iter().any(|x| x == t);
    if has("spans") {
        sections.push(vec![
            "## Querying".to_string(),
            "Attribute keys contain dots, so quote them in JSON paths: json_extract(attributes, '$.\"gen_ai.tool.name\"'); list keys with json_each(spans.attributes).".to_string(),
            "Times are integer nanoseconds since the Unix epoch; seq orders a trace's spans by start time; step is the agent's own step index; is_error = status ERROR or an error type.".to_string(),
        ]);
        let mut dist = vec!["## Value distributions".to_string()];
        for (label, sql) in [
            ("spans.kind", "SELECT kind, COUNT(*) FROM spans GROUP BY kind ORDER BY 2 DESC"),
            ("spans.status_code", "SELECT status_code, COUNT(*) FROM spans GROUP BY status_code ORDER BY 2 DESC"),
            ("top spans.error_type", "SELECT error_type, COUNT(*) FROM spans WHERE error_type IS NOT NULL GROUP BY error_type ORDER BY 2 DESC, 1"),
            ("top spans.tool_name", "SELECT tool_name, COUNT(*) FROM spans WHERE tool_name IS NOT NULL GROUP BY tool_name ORDER BY 2 DESC, 1"),
            ("top spans.agent_name", "SELECT agent_name, COUNT(*) FROM spans WHERE agent_name IS NOT NULL GROUP BY agent_name ORDER BY 2 DESC, 1"),
            ("top spans.model", "SELECT model, COUNT(*) FROM spans WHERE model IS NOT NULL GROUP BY model ORDER BY 2 DESC, 1"),
        ] {
            dist.push(format!("{label}: {}", top_values(conn, sql)?));
        }
        if has("traces") {
            for (label, sql) in [
                ("traces.status", "SELECT status, COUNT(*) FROM traces GROUP BY status ORDER BY 2 DESC"),
                ("traces.outcome", "SELECT outcome, COUNT(*) FROM traces WHERE outcome IS NOT NULL GROUP BY outcome ORDER BY 2 DESC, 1"),
                ("traces.framework", "SELECT framework, COUNT(*) FROM traces WHERE framework IS NOT NULL GROUP BY framework ORDER BY 2 DESC, 1"),
                ("traces.source_format", "SELECT source_format, COUNT(*) FROM traces GROUP BY source_format ORDER BY 2 DESC"),
            ] {
                dist.push(format!("{label}: {}", top_values(conn, sql)?));
            }
        }
        sections.push(dist);

        let keys = top_values(
            conn,
            &format!(
                "SELECT j.key, COUNT(*) FROM (SELECT attributes FROM spans LIMIT {ATTRIBUTE_SAMPLE}) AS s, \
                 json_each(s.attributes) AS j GROUP BY j.key ORDER BY 2 DESC, 1 LIMIT 40"
            ),
        )?;
        sections.push(vec![
            format!("## Attribute keys (in the first {ATTRIBUTE_SAMPLE} spans)"),
            keys,
        ]);
    }

    let mut samples = vec!["## Sample rows (values clipped, secrets redacted)".to_string()];
    if has("traces") {
        samples.extend(sample_rows(
            conn,
            "traces",
            "SELECT * FROM traces ORDER BY has_error DESC, rowid LIMIT 1",
        )?);
    }
    if has("spans") {
        for sql in [
            "SELECT * FROM spans WHERE is_error = 1 LIMIT 1",
            "SELECT * FROM spans WHERE kind = 'llm' LIMIT 1",
            "SELECT * FROM spans WHERE kind = 'tool' AND is_error = 0 LIMIT 1",
            "SELECT * FROM spans WHERE kind = 'agent' LIMIT 1",
        ] {
            samples.extend(sample_rows(conn, "spans", sql)?);
        }
    }
    if has("trace_tools") {
        samples.extend(sample_rows(
            conn,
            "trace_tools",
            "SELECT * FROM trace_tools ORDER BY max_consecutive DESC LIMIT 1",
        )?);
    }
    sections.push(samples);

    Ok(fit(sections, budget_chars))
}

/// Tables a prompt may mention, in creation order.
fn visible_tables(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY rowid",
    )?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(names
        .into_iter()
        .filter(|n| !HIDDEN_TABLES.contains(&n.as_str()))
        .collect())
}

/// `name TYPE` for each column, with `PK` marks.
fn columns(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info(\"{table}\")"))?;
    let cols = stmt
        .query_map([], |r| {
            let name: String = r.get(1)?;
            let ty: String = r.get(2)?;
            let pk: i64 = r.get(5)?;
            Ok((name, ty, pk))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(cols
        .into_iter()
        .filter(|(name, _, _)| !is_hidden_column(table, name))
        .map(|(name, ty, pk)| format!("{name} {ty}{}", if pk > 0 { " PK" } else { "" }))
        .collect())
}

/// `value (count), …` for the first [`TOP_VALUES`] rows of a two-column query.
fn top_values(conn: &Connection, sql: &str) -> Result<String> {
    let mut stmt = conn.prepare(sql)?;
    let mut rows = stmt.query([])?;
    let mut parts = Vec::new();
    let mut more = 0usize;
    while let Some(r) = rows.next()? {
        if parts.len() == TOP_VALUES {
            more += 1;
            continue;
        }
        let value = render(r.get_ref(0)?);
        let count: i64 = r.get(1)?;
        parts.push(format!("{} ({count})", prompt_safe(&value, 48)));
    }
    if parts.is_empty() {
        return Ok("(none)".to_string());
    }
    if more > 0 {
        parts.push(format!("… {more} more"));
    }
    Ok(parts.join(", "))
}

/// Each row as `table: col=value; …` with NULL columns left out.
fn sample_rows(conn: &Connection, table: &str, sql: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(sql)?;
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    let mut rows = stmt.query([])?;
    let mut lines = Vec::new();
    while let Some(r) = rows.next()? {
        let mut fields = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let value = r.get_ref(i)?;
            if matches!(value, ValueRef::Null) || is_hidden_column(table, name) {
                continue;
            }
            fields.push(format!(
                "{name}={}",
                prompt_safe(&render(value), SAMPLE_VALUE_CHARS)
            ));
        }
        lines.push(format!("{table}: {}", fields.join("; ")));
    }
    Ok(lines)
}

fn render(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".to_string(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => format!("<{} bytes>", b.len()),
    }
}

/// Joins sections line by line while they fit; a line that does not fit is cut (tables) or
/// dropped, and a closing note says the description was clipped.
fn fit(sections: Vec<Vec<String>>, budget: usize) -> String {
    const NOTE: &str = "… (clipped to the character budget)";
    let note_len = NOTE.chars().count() + 1;
    let mut out = String::new();
    let mut used = 0usize;
    let mut clipped = false;
    'sections: for section in sections {
        for line in section {
            let len = line.chars().count() + 1;
            if used + len + note_len <= budget {
                out.push_str(&line);
                out.push('\n');
                used += len;
            } else {
                // Keep what fits of the line itself, then stop: later lines would read as
                // complete when they are not.
                let room = budget.saturating_sub(used + note_len + 1);
                if room > 20 {
                    let part: String = line.chars().take(room).collect();
                    out.push_str(&part);
                    out.push('\n');
                    used += room + 1;
                }
                clipped = true;
                break 'sections;
            }
        }
    }
    if clipped && used + note_len <= budget {
        out.push_str(NOTE);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_respects_the_budget() {
        let sections = vec![vec!["a".repeat(50), "b".repeat(50)], vec!["c".repeat(50)]];
        let all = fit(sections.clone(), 10_000);
        assert_eq!(all.lines().count(), 3);
        for budget in [0, 10, 60, 100, 130] {
            let out = fit(sections.clone(), budget);
            assert!(out.chars().count() <= budget, "{budget}: {out:?}");
        }
        assert!(fit(sections, 100).contains("clipped"));
    }
}
