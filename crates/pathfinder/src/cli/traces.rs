//! `pathfinder traces`: import trace files into a SQLite store, describe a store for a prompt,
//! export one trace as the files the Detector's shell reads.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use traces::{schema, Format, ImportOptions, Store};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Import trace files; each file is one transaction (a rejected file imports nothing).
    Import {
        /// OTLP/JSON, JSON Lines of spans, or chat-log files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// The store (created if missing).
        #[arg(long, value_name = "PATH")]
        db: PathBuf,
        /// The input format; `auto` sniffs each file's content.
        #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
        format: InputFormat,
    },
    /// Describe a store for a prompt: tables, columns, value distributions, sample rows.
    Schema {
        #[arg(long, value_name = "PATH")]
        db: PathBuf,
        /// The most characters to print.
        #[arg(long, default_value_t = 8000)]
        budget: usize,
    },
    /// Export one trace as DIR/ID.json (the trace) and DIR/ID.spans.jsonl (its spans).
    Export {
        #[arg(long, value_name = "PATH")]
        db: PathBuf,
        /// The trace id.
        #[arg(long, value_name = "ID")]
        trace: String,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum InputFormat {
    Otlp,
    Jsonl,
    Chatlog,
    Auto,
}

impl From<InputFormat> for Format {
    fn from(value: InputFormat) -> Self {
        match value {
            InputFormat::Otlp => Format::Otlp,
            InputFormat::Jsonl => Format::Jsonl,
            InputFormat::Chatlog => Format::Chatlog,
            InputFormat::Auto => Format::Auto,
        }
    }
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Import { files, db, format } => import(&files, &db, format.into()),
        Command::Schema { db, budget } => {
            let store =
                Store::open_read_only(&db).with_context(|| format!("opening {}", db.display()))?;
            print!("{}", schema::discover(store.connection(), budget)?);
            Ok(())
        }
        Command::Export { db, trace, out } => {
            let store =
                Store::open_read_only(&db).with_context(|| format!("opening {}", db.display()))?;
            let files = store.export_trace(&trace, &out)?;
            println!("{}", files.trace_json.display());
            println!("{}", files.spans_jsonl.display());
            Ok(())
        }
    }
}

fn import(files: &[PathBuf], db: &PathBuf, format: Format) -> Result<()> {
    let mut store = Store::open(db).with_context(|| format!("opening {}", db.display()))?;
    let progress = if files.len() > 1 {
        let bar = ProgressBar::new(files.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} files, {elapsed} ({eta} left)")
                .expect("static template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let (mut rejected, mut traces, mut spans, mut labels) = (0usize, 0usize, 0usize, 0usize);
    // Parsing runs on worker threads; commits stay on this one, file by file, in order.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    store.import_files(
        files,
        format,
        &ImportOptions::default(),
        workers,
        |file, result| {
            match result {
                Ok(report) => {
                    traces += report.trace_ids.len();
                    spans += report.spans;
                    labels += report.labels;
                    progress.suspend(|| {
                        println!(
                            "imported {} ({}): {} traces, {} spans, {} labels",
                            file.display(),
                            report.format,
                            report.trace_ids.len(),
                            report.spans,
                            report.labels
                        );
                        for warning in &report.warnings {
                            eprintln!("warning: {}: {warning}", file.display());
                        }
                    });
                }
                Err(err) => {
                    rejected += 1;
                    progress.suspend(|| eprintln!("error: {err}"));
                }
            }
            progress.inc(1);
        },
    );
    progress.finish_and_clear();
    println!(
        "{} of {} files imported into {}: {traces} traces, {spans} spans, {labels} labels",
        files.len() - rejected,
        files.len(),
        db.display()
    );
    if rejected > 0 {
        bail!(
            "{rejected} of {} files were rejected; nothing of those files was imported",
            files.len()
        );
    }
    Ok(())
}
