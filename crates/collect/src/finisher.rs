//! The finisher: one thread that finds traces that have ended (their root has arrived and no
//! span has come for the quiet period), stores each whole trace through the trace store's OTLP
//! importer (replacing an earlier, shorter copy), has the Detector diagnose it, and records,
//! prints and exports the verdict. It starts with whatever the inbox holds, so traces that
//! ended while the receiver was down are diagnosed when it comes back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use detect::{Detector, Policy, Transcript, Verdict};

use crate::export::Exporter;
use crate::inbox::{now_ms, Inbox, VerdictRow};
use crate::Error;

/// Whatever names a trace's deficiency: the Detector with a policy (the expert, a trained
/// checkpoint), run on the trace as the store holds it.
pub trait Diagnose: Send {
    /// How verdicts name the detector (`expert`, `checkpoint:DIR (calibration …)`).
    fn name(&self) -> String;
    /// Investigates one stored trace.
    fn diagnose(&mut self, trace_id: &str) -> Result<Transcript, String>;
}

/// The Detector over the store with a fresh policy per trace.
pub struct DetectorDiagnoser {
    detector: Detector,
    name: String,
    make_policy: Box<dyn FnMut() -> Result<Box<dyn Policy>, String> + Send>,
}

impl DetectorDiagnoser {
    pub fn new(
        store: &Path,
        config: detect::Config,
        name: impl Into<String>,
        make_policy: impl FnMut() -> Result<Box<dyn Policy>, String> + Send + 'static,
    ) -> Result<DetectorDiagnoser, Error> {
        let detector =
            Detector::new(store, config, false).map_err(|e| Error::Detector(e.to_string()))?;
        Ok(DetectorDiagnoser {
            detector,
            name: name.into(),
            make_policy: Box::new(make_policy),
        })
    }
}

impl Diagnose for DetectorDiagnoser {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn diagnose(&mut self, trace_id: &str) -> Result<Transcript, String> {
        let policy = (self.make_policy)()?;
        self.detector
            .investigate(trace_id, policy)
            .map_err(|e| e.to_string())
    }
}

/// When a trace counts as ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// No span for this long after the root arrived.
    pub quiet: Duration,
    /// No span for this long, root or not.
    pub max_wait: Duration,
    /// How often the inbox is looked at.
    pub tick: Duration,
}

pub(crate) struct Finisher {
    pub inbox: PathBuf,
    pub store: PathBuf,
    pub timing: Timing,
    pub diagnoser: Box<dyn Diagnose>,
    pub exporter: Option<Exporter>,
    pub print: bool,
    pub stop: Arc<AtomicBool>,
}

impl Finisher {
    /// Runs until `stop` is set; an error opening the inbox or the store ends it.
    pub fn run(mut self) -> Result<(), Error> {
        let mut inbox = Inbox::open(&self.inbox)?;
        let mut store = traces::Store::open(&self.store).map_err(|e| Error::Store {
            path: self.store.clone(),
            reason: e.to_string(),
        })?;
        let name = self.diagnoser.name();
        let mut warned = false;
        while !self.stop.load(Ordering::Relaxed) {
            let ready = match inbox.ready(
                now_ms(),
                self.timing.quiet.as_millis() as i64,
                self.timing.max_wait.as_millis() as i64,
            ) {
                Ok(ready) => ready,
                Err(e) => {
                    if !warned {
                        tracing::warn!("reading the inbox failed (retrying): {e}");
                        warned = true;
                    }
                    std::thread::sleep(self.timing.tick);
                    continue;
                }
            };
            if ready.is_empty() {
                std::thread::sleep(self.timing.tick);
                continue;
            }
            for trace in ready {
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                let verdict = self.finish(
                    &mut inbox,
                    &mut store,
                    &name,
                    &trace.trace_id,
                    trace.last_ms,
                );
                match verdict {
                    Ok(()) => warned = false,
                    Err(e) => {
                        // The inbox could not be written: the trace stays open and is tried
                        // again on the next tick.
                        tracing::warn!(trace = %trace.trace_id, "recording a verdict failed: {e}");
                        std::thread::sleep(self.timing.tick);
                    }
                }
            }
        }
        Ok(())
    }

    /// Stores, diagnoses and records one ended trace.
    fn finish(
        &mut self,
        inbox: &mut Inbox,
        store: &mut traces::Store,
        name: &str,
        trace_id: &str,
        last_ms: i64,
    ) -> rusqlite::Result<()> {
        let (text, spans) = inbox.assemble(trace_id)?;
        let stored = store.import_text(&text, traces::Format::Otlp, "otlp:collect", true);
        let (transcript, outcome) = match stored {
            Err(e) => (None, Err(format!("the trace could not be stored: {e}"))),
            Ok(_) => match self.diagnoser.diagnose(trace_id) {
                Ok(t) => {
                    let outcome = t
                        .verdict()
                        .cloned()
                        .ok_or_else(|| format!("no verdict: {}", t.outcome.describe()));
                    (Some(t), outcome)
                }
                Err(e) => (None, Err(format!("the diagnosis failed: {e}"))),
            },
        };
        let (framework, root_span) = store
            .connection()
            .query_row(
                "SELECT framework, root_span_id FROM traces WHERE trace_id = ?1",
                [trace_id],
                |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                    ))
                },
            )
            .unwrap_or((None, None));
        let row = VerdictRow {
            trace_id: trace_id.to_string(),
            spans,
            detector: name.to_string(),
            label: match &outcome {
                Ok(v) => v.deficiency_id().unwrap_or("blame").to_string(),
                Err(_) => "error".into(),
            },
            verdict: outcome
                .as_ref()
                .ok()
                .and_then(|v| serde_json::to_value(v).ok()),
            explanation: match &outcome {
                Ok(v) => explain(v),
                Err(e) => e.clone(),
            },
            framework,
            last_span_ms: last_ms,
            diagnosed_ms: now_ms(),
            diagnoses: 1,
        };
        let transcript_json = transcript
            .as_ref()
            .and_then(|t| serde_json::to_string(t).ok());
        inbox.record(&row, transcript_json.as_deref())?;
        if self.print {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "verdict trace={} spans={} label={} latency_ms={} detector={:?} answer={:?}",
                row.trace_id,
                row.spans,
                row.label,
                row.diagnosed_ms - row.last_span_ms,
                row.detector,
                row.explanation
            );
            let _ = out.flush();
        }
        tracing::info!(trace = %row.trace_id, label = %row.label, "diagnosed");
        if let Some(exporter) = &self.exporter {
            exporter.send(&row, root_span.as_deref());
        }
        Ok(())
    }
}

/// A verdict in one line: the deficiency, where it lives and the evidence.
pub fn explain(verdict: &Verdict) -> String {
    verdict.render().trim_start_matches("answer: ").to_string()
}
