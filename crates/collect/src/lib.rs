//! `collect`: diagnose agent traces as they arrive.
//!
//! An OTLP/HTTP receiver (`POST /v1/traces`, protobuf or JSON, gzip or not) in front of the
//! trace store. Three threads with one job each:
//!
//! - the **server** (tokio, axum) checks a request (token, rate, media type, size), decodes it,
//!   has every span read by the store's own OTLP importer ([`intake`]) and hands the accepted
//!   spans to the writer; it answers only when the writer says they are durable, with OTLP's
//!   partial success for spans the importer refused, or `503` + `Retry-After` when the writer's
//!   queue is full (back-pressure);
//! - the **writer** owns the [`inbox`] connection and commits the spans of every request
//!   waiting in its queue in one transaction (group commit, `synchronous = FULL`);
//! - the **finisher** ([`finisher`]) diagnoses each trace that has ended (root arrived, then a
//!   quiet period), stores it in the trace store exactly as `traces import` would, records the
//!   verdict, prints it, and optionally sends it on as a `gen_ai.evaluation.result` event
//!   ([`export`]).
//!
//! The server also serves the verdicts: a live page (`/`, each trace opening its span tree
//! and investigation at `/traces/{id}`), and JSON (`/api/verdicts`, `/api/verdicts/{id}`).

pub mod export;
pub mod finisher;
pub mod inbox;
pub mod intake;
pub mod proto;
mod server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use finisher::{DetectorDiagnoser, Diagnose, Timing};
pub use inbox::{Counts, VerdictRow};

/// What can go wrong starting or running the receiver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the inbox {path}: {reason}")]
    Inbox { path: PathBuf, reason: String },
    #[error("the trace store {path}: {reason}")]
    Store { path: PathBuf, reason: String },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the Detector: {0}")]
    Detector(String),
    #[error("{0}")]
    Config(String),
    #[error("the {0} thread failed: {1}")]
    Thread(&'static str, String),
}

impl Error {
    fn inbox(path: &Path, e: rusqlite::Error) -> Error {
        Error::Inbox {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    }
}

/// The receiver's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The trace store finished traces are imported into (created if absent).
    pub store: PathBuf,
    /// The inbox (created if absent); by default the store's path with `.inbox` appended.
    pub inbox: PathBuf,
    pub listen: SocketAddr,
    /// Requests must carry `Authorization: Bearer TOKEN` (pages also take `?token=`).
    pub token: Option<String>,
    /// The largest request body, as sent (compressed).
    pub max_body_bytes: usize,
    /// The largest body once decompressed.
    pub max_decoded_bytes: usize,
    /// Requests per second across all clients (a token bucket a second deep); `None`: no limit.
    pub max_requests_per_second: Option<f64>,
    /// Requests waiting for the writer before new ones get `503` + `Retry-After`.
    pub queue: usize,
    pub timing: Timing,
    /// An OTLP/HTTP collector that receives each verdict as a `gen_ai.evaluation.result` event.
    pub export_to: Option<String>,
    /// Print one line per verdict on stdout.
    pub print_verdicts: bool,
    /// Traces on the live page.
    pub page_rows: usize,
}

impl Config {
    /// Defaults for a store: localhost:4318, 4 MiB bodies (64 MiB decompressed), no rate
    /// limit, a queue of 256 requests, a 2-second quiet period, 5 minutes for traces whose root
    /// never arrives.
    pub fn new(store: impl Into<PathBuf>) -> Config {
        let store = store.into();
        let mut inbox = store.clone().into_os_string();
        inbox.push(".inbox");
        Config {
            inbox: inbox.into(),
            store,
            listen: SocketAddr::from(([127, 0, 0, 1], 4318)),
            token: None,
            max_body_bytes: 4 << 20,
            max_decoded_bytes: 64 << 20,
            max_requests_per_second: None,
            queue: 256,
            timing: Timing {
                quiet: Duration::from_secs(2),
                max_wait: Duration::from_secs(300),
                tick: Duration::from_millis(100),
            },
            export_to: None,
            print_verdicts: true,
            page_rows: 200,
        }
    }
}

/// A running receiver.
pub struct Collector {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<(&'static str, JoinHandle<Result<(), Error>>)>,
}

impl Collector {
    /// Opens the inbox and the store, binds the address and starts the three threads.
    pub fn start(config: Config, diagnoser: Box<dyn Diagnose>) -> Result<Collector, Error> {
        // Open both once here so a bad path is an error before anything listens.
        inbox::Inbox::open(&config.inbox)?;
        traces::Store::open(&config.store).map_err(|e| Error::Store {
            path: config.store.clone(),
            reason: e.to_string(),
        })?;
        let exporter = config
            .export_to
            .as_deref()
            .map(export::Exporter::new)
            .transpose()?;
        if config.token.is_none() && !config.listen.ip().is_loopback() {
            tracing::warn!(
                "listening on {} without a token: anyone who reaches it can send spans and read verdicts",
                config.listen
            );
        }
        let listener =
            std::net::TcpListener::bind(config.listen).map_err(|source| Error::Listen {
                addr: config.listen,
                source,
            })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| Error::Listen {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let (jobs, queue) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let inbox_path = config.inbox.clone();
        let writer = std::thread::Builder::new()
            .name("collect-writer".into())
            .spawn(move || server::write_loop(&inbox_path, queue))
            .map_err(|e| Error::Thread("writer", e.to_string()))?;
        let finisher = finisher::Finisher {
            inbox: config.inbox.clone(),
            store: config.store.clone(),
            timing: config.timing,
            diagnoser,
            exporter,
            print: config.print_verdicts,
            stop: Arc::clone(&stop),
        };
        let finisher = std::thread::Builder::new()
            .name("collect-finisher".into())
            .spawn(move || finisher.run())
            .map_err(|e| Error::Thread("finisher", e.to_string()))?;
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let app = server::App::new(&config, jobs);
        let server = std::thread::Builder::new()
            .name("collect-server".into())
            .spawn(move || server::serve(listener, app, shutdown_rx))
            .map_err(|e| Error::Thread("server", e.to_string()))?;
        Ok(Collector {
            addr,
            stop,
            shutdown: Some(shutdown),
            threads: vec![
                ("server", server),
                ("writer", writer),
                ("finisher", finisher),
            ],
        })
    }

    /// The address it listens on (the port is the real one when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until SIGINT or SIGTERM, then stops.
    pub fn run_until_signal(self) -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Thread("signal", e.to_string()))?;
        runtime.block_on(async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                let mut term = signal(SignalKind::terminate())
                    .map_err(|e| Error::Thread("signal", e.to_string()))?;
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
            Ok::<(), Error>(())
        })?;
        self.stop()
    }

    /// Stops accepting requests, lets the writer finish what it acknowledged, stops the
    /// finisher after the trace it is on, and joins the threads.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let mut first_error = None;
        for (name, thread) in self.threads.drain(..) {
            let result = thread
                .join()
                .map_err(|_| Error::Thread(name, "panicked".into()))
                .and_then(|r| r);
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
