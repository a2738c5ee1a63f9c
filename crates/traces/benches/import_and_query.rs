//! Import throughput and analyst-query latency on a generated store (default 1,000 traces of
//! 1,000 spans), against the reference a user would otherwise write: row-by-row autocommit
//! inserts for the import, and raw-span SQL without the rollups for the queries.
//!
//! Run: `cargo bench -p traces --bench import_and_query` (options after `--`:
//! `--traces N --spans-per-trace M --query-runs R --naive-seconds S --phases F --dir DIR
//! --import-only`). `--phases F` times the import's phases on the first F files (default 100;
//! 0 skips); `--dir` keeps the generated traces and reuses them; `--import-only` stops after
//! the import, for profiling. Without cargo bench's `--bench` flag (e.g. under
//! `cargo test --all-targets`) it does nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};
use serde_json::{json, Value};
use traces::{queries, schema, Format, Store};

struct Options {
    traces: usize,
    spans_per_trace: usize,
    query_runs: usize,
    naive_seconds: f64,
    /// Keep the generated traces here and reuse them on the next run (`--dir DIR`).
    dir: Option<PathBuf>,
    /// Stop after the `Store::import_files` measurement (`--import-only`), for profiling.
    import_only: bool,
    /// Time the import's phases on the first files, one thread (`--phases N`; 0: skip).
    phases: usize,
}

fn parse_options() -> Option<Options> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return None;
    }
    let mut options = Options {
        traces: 1000,
        spans_per_trace: 1000,
        query_runs: 200,
        naive_seconds: 20.0,
        dir: None,
        import_only: false,
        phases: 100,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--import-only" {
            options.import_only = true;
            continue;
        }
        if arg == "--dir" {
            options.dir = Some(PathBuf::from(it.next().expect("--dir needs a path")));
            continue;
        }
        let mut value = || {
            it.next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--traces" => options.traces = value() as usize,
            "--spans-per-trace" => options.spans_per_trace = value() as usize,
            "--query-runs" => options.query_runs = value() as usize,
            "--naive-seconds" => options.naive_seconds = value(),
            "--phases" => options.phases = value() as usize,
            _ => {}
        }
    }
    Some(options)
}

/// A small deterministic generator (xorshift64*), so every run builds the same store.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uses the high bits; the low bits of xorshift64* are weak.
    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 32) % n
    }
}

const TOOLS: [(&str, u64); 5] = [
    ("search", 2),
    ("read_file", 5),
    ("calculator", 1),
    ("table_lookup", 8),
    ("python", 12),
];

/// One trace as the agents write it: a root `agent.run`, then steps of an LLM call followed by
/// a tool call (a uniformly drawn tool; every tenth trace is stuck calling `search` for six
/// steps from step 100), with per-tool error rates.
fn write_trace(path: &Path, t: usize, spans: usize, rng: &mut Rng) -> std::io::Result<()> {
    let trace_id = format!("{:032x}", (t as u128 + 1) * 0x9E37_79B9_7F4A_7C15);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let base = 1_700_000_000_000_000_000i64 + t as i64 * 1_000_000_000_000;
    let mut clock = base + 1_000;
    let mut tool = 0usize;
    let mut lines: Vec<Value> = Vec::with_capacity(spans);
    for i in 1..spans {
        let step = ((i - 1) / 2) as i64;
        let id = format!("{:016x}", i + 1);
        let start = clock;
        let line = if i % 2 == 1 {
            let dur = 200_000_000 + rng.below(800_000_000) as i64;
            clock += dur + 1_000;
            json!({"trace_id": trace_id, "span_id": id, "parent_span_id": "0000000000000001", "name": "llm.chat",
                   "kind": "llm", "start_time_unix_nano": start, "end_time_unix_nano": start + dur,
                   "status": {"code": "OK", "message": ""},
                   "attributes": {"code.filepath": "toolcaller/llm.py", "code.function": "LLMClient.chat", "code.lineno": 88,
                     "gen_ai.agent.name": "toolcaller", "pathfinder.step_index": step, "gen_ai.operation.name": "chat",
                     "gen_ai.request.model": "pathfinder-scripted", "gen_ai.request.temperature": 0.0,
                     "gen_ai.usage.input_tokens": 200 + rng.below(2000), "gen_ai.usage.output_tokens": 10 + rng.below(200),
                     "gen_ai.response.finish_reasons": "[\"tool_calls\"]",
                     "input.value": format!("[{{\"role\":\"user\",\"content\":\"question {t} step {step}: find the table row and compute the answer\"}}]"),
                     "output.value": format!("{{\"tool_calls\":[{{\"name\":\"{}\"}}]}}", TOOLS[tool].0)}})
        } else {
            tool = if t % 10 == 0 && (100..106).contains(&step) {
                0
            } else {
                rng.below(TOOLS.len() as u64) as usize
            };
            let (name, error_pct) = TOOLS[tool];
            let failed = rng.below(100) < error_pct;
            let dur = 1_000_000 + rng.below(50_000_000) as i64;
            clock += dur + 1_000;
            let mut attrs = json!({"code.filepath": "toolcaller/tools.py", "code.function": "ToolRunner.run", "code.lineno": 41,
                "gen_ai.agent.name": "toolcaller", "pathfinder.step_index": step, "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name, "gen_ai.tool.call.arguments": format!("{{\"query\":\"q{}\"}}", rng.below(1000)),
                "gen_ai.tool.call.id": format!("call_{i}"), "input.value": "{\"query\":\"...\"}",
                "output.value": if failed { "" } else { "3 results: corpus/table.csv row 17" }});
            if failed {
                attrs["error.type"] = json!("ToolError");
                attrs["exception.message"] = json!(format!("{name} failed"));
            }
            json!({"trace_id": trace_id, "span_id": id, "parent_span_id": "0000000000000001", "name": format!("tool.{name}"),
                   "kind": "tool", "start_time_unix_nano": start, "end_time_unix_nano": start + dur,
                   "status": {"code": if failed { "ERROR" } else { "OK" }, "message": ""}, "attributes": attrs})
        };
        lines.push(line);
    }
    let steps = (spans as i64 - 2) / 2;
    let root = json!({"trace_id": trace_id, "span_id": "0000000000000001", "parent_span_id": null, "name": "agent.run",
        "kind": "agent", "start_time_unix_nano": base, "end_time_unix_nano": clock + 1_000,
        "status": {"code": "OK", "message": ""},
        "attributes": {"code.filepath": "toolcaller/agent.py", "code.function": "Agent.run", "code.lineno": 12,
          "gen_ai.agent.name": "toolcaller", "pathfinder.step_index": steps, "pathfinder.framework": "toolcaller",
          "pathfinder.task_id": format!("gaia-{:03}", t % 50), "pathfinder.outcome": "completed", "pathfinder.answer": "42"}});
    // The agent writes its root span last, when the run ends.
    for line in lines.iter().chain(std::iter::once(&root)) {
        serde_json::to_writer(&mut out, line)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// What a user would write: parse each line, one INSERT per span, each its own (autocommitted)
/// transaction, default journal settings.
fn naive_import(db: &Path, files: &[PathBuf], budget: Duration) -> (usize, Duration) {
    let conn = Connection::open(db).expect("open naive db");
    conn.execute_batch(traces::SCHEMA_SQL).expect("schema");
    // Spans only, as a user loading a span dump would (the bundled SQLite enforces foreign keys).
    conn.execute_batch("PRAGMA foreign_keys = OFF")
        .expect("pragma");
    let started = Instant::now();
    let mut spans = 0usize;
    'files: for file in files {
        let text = std::fs::read_to_string(file).expect("read");
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("json");
            let a = &v["attributes"];
            conn.execute(
                "INSERT INTO spans (trace_id, span_id, parent_span_id, name, kind, start_time_ns, end_time_ns, \
                 status_code, is_error, error_type, tool_name, agent_name, step, seq, depth, attributes) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0, 0, ?14)",
                params![
                    v["trace_id"].as_str(),
                    v["span_id"].as_str(),
                    v["parent_span_id"].as_str(),
                    v["name"].as_str(),
                    v["kind"].as_str(),
                    v["start_time_unix_nano"].as_i64(),
                    v["end_time_unix_nano"].as_i64(),
                    v["status"]["code"].as_str(),
                    v["status"]["code"].as_str() == Some("ERROR"),
                    a["error.type"].as_str(),
                    a["gen_ai.tool.name"].as_str(),
                    a["gen_ai.agent.name"].as_str(),
                    a["pathfinder.step_index"].as_i64(),
                    a.to_string(),
                ],
            )
            .expect("insert");
            spans += 1;
            if started.elapsed() >= budget {
                break 'files;
            }
        }
    }
    (spans, started.elapsed())
}

/// This process's user + system CPU time (Linux), to tell CPU cost from waiting on a busy machine.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(") ")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The calling thread's user + system CPU time (Linux).
fn thread_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(") ")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// CPU time per phase of an import on one thread, in microseconds per span: reading the
/// files, parsing JSON Lines into spans, assembling traces (validation, derived columns,
/// rollups), then committing (`Store::import_file`, all phases) into a store with and without
/// the secondary indexes of `spans`; the differences give the SQLite inserts and the index
/// maintenance.
fn time_phases(dir: &Path, files: &[PathBuf]) {
    let per_span = |d: Duration, spans: usize| d.as_secs_f64() * 1e6 / spans.max(1) as f64;
    let mut spans = 0usize;
    let started = thread_cpu_time();
    for file in files {
        std::hint::black_box(std::fs::read(file).expect("read"));
    }
    let read = thread_cpu_time() - started;
    let started = thread_cpu_time();
    let mut batches = Vec::new();
    for file in files {
        let (_, batch) = traces::import::read_file(file, Format::Jsonl).expect("parse");
        spans += batch.spans.len();
        batches.push(batch);
    }
    let parse = thread_cpu_time() - started - read;
    let started = thread_cpu_time();
    for batch in batches {
        std::hint::black_box(
            traces::assemble::assemble(batch, "bench", Format::Jsonl, &Default::default())
                .expect("assemble"),
        );
    }
    let assemble = thread_cpu_time() - started;
    let whole = |name: &str, drop_indexes: bool| {
        let mut store = Store::open(dir.join(name)).expect("open store");
        if drop_indexes {
            store
                .connection()
                .execute_batch(
                    "DROP INDEX spans_by_tool; DROP INDEX spans_errors; DROP INDEX spans_by_error_type;",
                )
                .expect("drop indexes");
        }
        let started = thread_cpu_time();
        for file in files {
            store.import_file(file, Format::Jsonl).expect("import");
        }
        thread_cpu_time() - started
    };
    let with_indexes = whole("phases.db", false);
    let without = whole("phases-noindex.db", true);
    let inserts = without.saturating_sub(read + parse + assemble);
    println!(
        "phases (one thread, {} files, CPU µs/span): read {:.2}, parse {:.2}, assemble {:.2}, \
         encode + SQLite inserts + commit {:.2}, secondary span indexes {:.2}; whole import {:.2}",
        files.len(),
        per_span(read, spans),
        per_span(parse, spans),
        per_span(assemble, spans),
        per_span(inserts, spans),
        per_span(with_indexes.saturating_sub(without), spans),
        per_span(with_indexes, spans),
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs a query `runs` times; returns (p50, p99, rows of the last run).
fn time_query(conn: &Connection, sql: &str, runs: usize) -> (Duration, Duration, Vec<Vec<String>>) {
    let mut times = Vec::with_capacity(runs);
    let mut rows = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut stmt = conn.prepare_cached(sql).expect("prepare");
        let n = stmt.column_count();
        rows = stmt
            .query_map([], |r| {
                (0..n)
                    .map(|i| r.get_ref(i).map(|v| format!("{v:?}")))
                    .collect::<rusqlite::Result<Vec<String>>>()
            })
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows");
        times.push(started.elapsed());
    }
    times.sort();
    (percentile(&times, 50.0), percentile(&times, 99.0), rows)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let Some(options) = parse_options() else {
        eprintln!("import_and_query: run with `cargo bench -p traces --bench import_and_query`");
        return;
    };
    let temp = tempfile::tempdir().expect("temp dir");
    let inputs = match &options.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("create --dir");
            dir.clone()
        }
        None => temp.path().to_path_buf(),
    };
    let total = options.traces * options.spans_per_trace;
    println!(
        "generating {} traces x {} spans = {total} spans in {}",
        options.traces,
        options.spans_per_trace,
        inputs.display()
    );
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let files: Vec<PathBuf> = (0..options.traces)
        .map(|t| inputs.join(format!("trace-{t:05}-of-{}.jsonl", options.spans_per_trace)))
        .collect();
    // A `--dir` that already holds every file is reused as it is.
    if !files.iter().all(|f| f.is_file()) {
        for (t, path) in files.iter().enumerate() {
            write_trace(path, t, options.spans_per_trace, &mut rng).expect("write trace");
        }
    }
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    println!(
        "input: {:.1} MiB of JSON Lines",
        bytes as f64 / (1 << 20) as f64
    );

    let dir = temp;
    if options.phases > 0 {
        time_phases(dir.path(), &files[..files.len().min(options.phases)]);
    }
    let db = dir.path().join("store.db");
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut store = Store::open(&db).expect("open store");
    let started = Instant::now();
    let cpu_started = cpu_time();
    let mut imported = 0usize;
    for result in store.import_files(
        &files,
        Format::Jsonl,
        &Default::default(),
        workers,
        |_, _| {},
    ) {
        imported += result.expect("import").spans;
    }
    let import_time = started.elapsed();
    let import_cpu = cpu_time() - cpu_started;
    let ours = imported as f64 / import_time.as_secs_f64();
    println!(
        "import (Store::import_files, {workers} parse threads, one transaction per file): {imported} spans in {:.2} s = {:.0} spans/s (CPU {:.2} s)",
        import_time.as_secs_f64(),
        ours,
        import_cpu.as_secs_f64()
    );
    if options.import_only {
        return;
    }
    let single_db = dir.path().join("single.db");
    let mut single = Store::open(&single_db).expect("open store");
    let subset = &files[..files.len().min(100)];
    let started = Instant::now();
    let mut single_spans = 0usize;
    for file in subset {
        single_spans += single
            .import_file(file, Format::Jsonl)
            .expect("import")
            .spans;
    }
    let single_time = started.elapsed();
    println!(
        "import (Store::import_file, one thread, first {} files): {single_spans} spans in {:.2} s = {:.0} spans/s",
        subset.len(),
        single_time.as_secs_f64(),
        single_spans as f64 / single_time.as_secs_f64()
    );
    drop(single);

    let naive_db = dir.path().join("naive.db");
    let (naive_spans, naive_time) = naive_import(
        &naive_db,
        &files,
        Duration::from_secs_f64(options.naive_seconds),
    );
    let naive = naive_spans as f64 / naive_time.as_secs_f64();
    println!(
        "reference (row-by-row autocommit INSERTs, default journal): {naive_spans} spans in {:.2} s = {:.0} spans/s; ratio {:.0}x",
        naive_time.as_secs_f64(),
        naive,
        ours / naive
    );
    drop(store);

    let store = Store::open_read_only(&db).expect("reopen read-only");
    let conn = store.connection();
    println!(
        "\nqueries ({} runs each indexed, {} raw; p50 / p99):",
        options.query_runs,
        (options.query_runs / 20).max(3)
    );
    for (name, indexed, raw) in queries::ALL {
        let (p50, p99, rows) = time_query(conn, indexed, options.query_runs);
        let (r50, r99, raw_rows) = time_query(conn, raw, (options.query_runs / 20).max(3));
        let agree = if name.contains("slowest") {
            rows.iter()
                .map(|r| &r[..2])
                .eq(raw_rows.iter().map(|r| &r[..2]))
        } else {
            rows == raw_rows
        };
        println!(
            "  {name:<34} indexed {} / {}   raw spans {} / {}   rows {}   same answer: {}",
            ms(p50),
            ms(p99),
            ms(r50),
            ms(r99),
            rows.len(),
            if agree { "yes" } else { "NO" }
        );
    }
    let started = Instant::now();
    let text = schema::discover(conn, 8000).expect("discover");
    println!(
        "\nschema::discover (8000-char budget): {} chars in {}",
        text.chars().count(),
        ms(started.elapsed())
    );
    let db_bytes = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    println!("store size: {:.1} MiB", db_bytes as f64 / (1 << 20) as f64);
}
