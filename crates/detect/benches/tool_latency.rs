//! Tool-call latency on a 10,000-span trace: p50/p99 of typical SQL and shell calls through
//! the Detector's tools, each against the reference a user would otherwise pick in the same
//! run: the same query through the `sqlite3` command-line tool (a process per call), and the
//! same pipeline through plain `sh -c` without the sandbox.
//!
//! Run: `cargo bench -p detect --bench tool_latency` (optionally `-- ITERATIONS`).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use detect::{Action, Actor, Config, Detector, Status};

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

fn time(iterations: usize, mut f: impl FnMut()) -> (f64, f64) {
    f(); // warm-up
    percentiles(
        (0..iterations)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let iterations: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.db");
    let trace = "00000000000000000000000000010000";
    {
        let mut store = traces::Store::open(&db).expect("store");
        let spans = detect::synthetic::large_trace(trace, 10_000, 7);
        let n = spans.len();
        store.import_spans(spans, "bench").expect("import");
        println!("trace {trace}: {n} spans in {}", db.display());
    }
    let detector = Detector::new(&db, Config::default(), false).expect("detector");
    let inv = detector.prepare(trace).expect("prepare");
    let tools = Arc::clone(&inv).tools(Actor::Main).expect("tools");
    let q = |s: &str| s.replace("{T}", &format!("'{trace}'"));
    let sql = [
        q("SELECT kind, COUNT(*) AS n FROM spans WHERE trace_id = {T} GROUP BY kind"),
        q("SELECT error_type, COUNT(*) AS n, MIN(step) AS first_step FROM spans WHERE trace_id = {T} AND is_error = 1 GROUP BY error_type ORDER BY n DESC"),
        q("SELECT tool_name, calls, errors, max_consecutive FROM trace_tools WHERE trace_id = {T} ORDER BY calls DESC"),
        q("SELECT step, name, substr(error_message, 1, 80) AS message FROM spans WHERE trace_id = {T} AND is_error = 1 ORDER BY seq LIMIT 20"),
    ];
    let shell = [
        "grep -c ERROR spans.jsonl",
        "jq -r .name spans.jsonl | sort | uniq -c | sort -rn",
        "jq -c 'select(.status.code == \"ERROR\") | .attributes[\"exception.message\"]' spans.jsonl | sort | uniq -c | head -5",
    ];
    let sqlite3 = which("sqlite3");
    println!("\n{iterations} iterations per call; milliseconds");
    println!(
        "{:<8} {:>8} {:>8} {:>10} {:>10} {:>8}  call",
        "tool", "p50", "p99", "ref p50", "ref p99", "ratio"
    );
    for query in &sql {
        let action = Action::Sql {
            query: query.clone(),
        };
        assert_eq!(tools.execute(&action).status, Status::Ok, "{query}");
        let (p50, p99) = time(iterations, || {
            tools.execute(&action);
        });
        let (r50, r99) = match &sqlite3 {
            Some(bin) => time(iterations.min(50), || {
                let out = Command::new(bin)
                    .arg("-readonly")
                    .arg(&db)
                    .arg(query)
                    .output()
                    .expect("sqlite3");
                assert!(out.status.success());
            }),
            None => (f64::NAN, f64::NAN),
        };
        println!(
            "{:<8} {p50:>8.2} {p99:>8.2} {r50:>10.2} {r99:>10.2} {:>8.2}  {}",
            "sql",
            p50 / r50,
            short(query)
        );
    }
    for pipeline in shell {
        let action = Action::Bash {
            pipeline: pipeline.to_string(),
        };
        let obs = tools.execute(&action);
        assert_eq!(obs.status, Status::Ok, "{pipeline}: {}", obs.text);
        let (p50, p99) = time(iterations.min(50), || {
            tools.execute(&action);
        });
        let (r50, r99) = time(iterations.min(50), || {
            let out = Command::new("sh")
                .arg("-c")
                .arg(pipeline)
                .current_dir(inv.episode_dir())
                .output()
                .expect("sh");
            assert!(out.status.success());
        });
        println!(
            "{:<8} {p50:>8.2} {p99:>8.2} {r50:>10.2} {r99:>10.2} {:>8.2}  {}",
            "bash",
            p50 / r50,
            short(pipeline)
        );
    }
    println!("\nref: sql = `sqlite3 -readonly DB QUERY` per call; bash = `sh -c PIPELINE` without the sandbox. ratio = p50 / ref p50.");
}

fn short(text: &str) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 70 {
        format!("{}…", one.chars().take(70).collect::<String>())
    } else {
        one
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}
