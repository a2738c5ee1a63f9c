//! `pathfinder collect`: an OpenTelemetry receiver that stores the spans agents export and
//! diagnoses each trace when it ends (`collect` crate).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::eval_models;

#[derive(Debug, Args)]
pub struct CollectArgs {
    /// The trace store finished traces are imported into (created if absent).
    #[arg(long)]
    pub db: PathBuf,
    /// A trained Detector (checkpoints/RUN/step-N) with its calibration; without it the
    /// expert diagnoses.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// The checkpoint's operating point: a file written by `pathfinder calibrate`, or `none`
    /// [default: the checkpoint's calibration.json when it has one].
    #[arg(long, value_name = "FILE|none", requires = "checkpoint")]
    pub calibration: Option<PathBuf>,
    /// keyword or expert, when no --checkpoint is given.
    #[arg(long, default_value = "expert", conflicts_with = "checkpoint")]
    pub policy: String,
    /// Where OTLP/HTTP is received (`/v1/traces`); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:4318")]
    pub listen: SocketAddr,
    /// The inbox where acknowledged spans are kept [default: the store's path + `.inbox`].
    #[arg(long, value_name = "PATH")]
    pub inbox: Option<PathBuf>,
    /// A file holding the bearer token every request must carry (`Authorization: Bearer
    /// TOKEN`; pages also take `?token=`). The environment variable PATHFINDER_COLLECT_TOKEN
    /// is read when no file is given.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// A trace has ended this many milliseconds after its root span arrived with no span since.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub quiet_ms: u64,
    /// A trace whose root never arrives is diagnosed after this many seconds without a span.
    #[arg(long, value_name = "S", default_value_t = 300)]
    pub max_wait_s: u64,
    /// The largest request body accepted (compressed as sent).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// The largest body once gzip is undone.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub max_decoded_bytes: usize,
    /// Requests per second accepted across all clients (more get 429 + Retry-After).
    #[arg(long, value_name = "N")]
    pub max_requests_per_second: Option<f64>,
    /// Requests waiting to be stored before new ones get 503 + Retry-After.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub queue: usize,
    /// Send each verdict to this OTLP/HTTP collector as a gen_ai.evaluation.result event
    /// (e.g. http://127.0.0.1:4318; plain http only).
    #[arg(long, value_name = "URL")]
    pub export_to: Option<String>,
    /// Traces listed on the live page.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub page_rows: usize,
}

pub fn run(args: CollectArgs) -> Result<()> {
    let token = match &args.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?;
            let token = text.trim().to_string();
            if token.is_empty() {
                bail!("{}: the token file is empty", path.display());
            }
            Some(token)
        }
        None => std::env::var("PATHFINDER_COLLECT_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()),
    };
    let mut config = collect::Config::new(&args.db);
    if let Some(inbox) = &args.inbox {
        config.inbox = inbox.clone();
    }
    config.listen = args.listen;
    config.token = token;
    config.max_body_bytes = args.max_body_bytes;
    config.max_decoded_bytes = args.max_decoded_bytes;
    config.max_requests_per_second = args.max_requests_per_second;
    config.queue = args.queue;
    config.timing.quiet = Duration::from_millis(args.quiet_ms);
    config.timing.max_wait = Duration::from_secs(args.max_wait_s);
    config.timing.tick = Duration::from_millis((args.quiet_ms / 4).clamp(10, 250));
    config.export_to = args.export_to.clone();
    config.page_rows = args.page_rows;
    // The store must exist before the Detector opens it.
    traces::Store::open(&args.db).with_context(|| format!("opening {}", args.db.display()))?;
    let diagnoser: Box<dyn collect::Diagnose> = match &args.checkpoint {
        Some(dir) => {
            eval_models::check_checkpoint(dir)?;
            let choice = eval_models::CalibrationChoice::parse(args.calibration.as_deref());
            let trained = eval_models::load_checkpoint(dir)?.calibrated(&choice)?;
            let name = trained.describe();
            let (mut policies, detect_config) = trained.head_policies()?;
            Box::new(collect::DetectorDiagnoser::new(
                &args.db,
                detect_config,
                name,
                move || Ok(policies()),
            )?)
        }
        None => {
            let name = args.policy.clone();
            detect::policies::by_name(&name).map_err(anyhow::Error::msg)?;
            Box::new(collect::DetectorDiagnoser::new(
                &args.db,
                detect::Config::default(),
                name.clone(),
                move || detect::policies::by_name(&name),
            )?)
        }
    };
    let detector = diagnoser.name();
    let collector =
        collect::Collector::start(config, diagnoser).context("starting the receiver")?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "listening on http://{addr} (OTLP/HTTP: http://{addr}/v1/traces; verdicts: http://{addr}/); detector: {detector}",
            addr = collector.addr()
        );
        let _ = writeln!(
            out,
            "export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://{}/v1/traces",
            collector.addr()
        );
        let _ = out.flush();
    }
    collector.run_until_signal().context("the receiver failed")
}
