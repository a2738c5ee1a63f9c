//! The HTTP side: OTLP/HTTP ingestion with its status codes, the writer it hands spans to,
//! and the verdicts as a live page and as JSON.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use prost::Message;
use serde_json::json;

use crate::inbox::{now_ms, Inbox, Written};
use crate::intake::{self, Encoding, Refusal, SpanRow};
use crate::{proto, Config, Error};

/// Spans waiting for the writer, and where to say whether they are durable.
pub(crate) struct WriteJob {
    rows: Vec<SpanRow>,
    reply: tokio::sync::oneshot::Sender<Result<Written, String>>,
}

/// The writer: commits every waiting request's spans in one transaction, then answers each.
pub(crate) fn write_loop(path: &Path, jobs: Receiver<WriteJob>) -> Result<(), Error> {
    let mut inbox = Inbox::open(path)?;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < 256 {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let rows: Vec<&[SpanRow]> = batch.iter().map(|j| j.rows.as_slice()).collect();
        match inbox.write(&rows, now_ms()) {
            Ok(written) => {
                for (job, w) in batch.into_iter().zip(written) {
                    let _ = job.reply.send(Ok(w));
                }
            }
            Err(e) => {
                tracing::warn!("the inbox refused a write: {e}");
                for job in batch {
                    let _ = job.reply.send(Err(e.to_string()));
                }
            }
        }
    }
    Ok(())
}

/// A token bucket one second deep.
struct Rate {
    per_second: f64,
    state: Mutex<(f64, Instant)>,
}

impl Rate {
    fn take(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, last) = *state;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.per_second)
            .min(self.per_second.max(1.0));
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            true
        } else {
            *state = (tokens, now);
            false
        }
    }
}

pub(crate) struct App {
    jobs: SyncSender<WriteJob>,
    token: Option<String>,
    rate: Option<Rate>,
    max_body: usize,
    max_decoded: usize,
    inbox: PathBuf,
    store: PathBuf,
    page_rows: usize,
    catalog: Arc<taxonomy::Catalog>,
}

impl App {
    pub(crate) fn new(config: &Config, jobs: SyncSender<WriteJob>) -> App {
        App {
            jobs,
            token: config.token.clone(),
            rate: config.max_requests_per_second.map(|per_second| Rate {
                per_second,
                state: Mutex::new((per_second.max(1.0), Instant::now())),
            }),
            max_body: config.max_body_bytes,
            max_decoded: config.max_decoded_bytes,
            inbox: config.inbox.clone(),
            store: config.store.clone(),
            page_rows: config.page_rows,
            catalog: Arc::new(
                taxonomy::Catalog::embedded()
                    .expect("the embedded catalog is checked by its tests"),
            ),
        }
    }

    /// The bearer token, from the header or (for pages opened in a browser) `?token=`.
    fn authorized(&self, headers: &HeaderMap, query: Option<&str>) -> bool {
        let Some(expected) = &self.token else {
            return true;
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or(query);
        given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves until `shutdown` fires.
pub(crate) fn serve(
    listener: std::net::TcpListener,
    app: App,
    shutdown: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("collect-http")
        .enable_all()
        .build()
        .map_err(|e| Error::Thread("server", e.to_string()))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::Thread("server", e.to_string()))?;
        let router = Router::new()
            .route("/v1/traces", post(ingest))
            .route("/", get(live_page))
            .route("/traces/{id}", get(trace_page))
            .route("/api/verdicts", get(verdicts_json))
            .route("/api/verdicts/{id}", get(verdict_json))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(Arc::new(app));
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.await;
            })
            .await
            .map_err(|e| Error::Thread("server", e.to_string()))
    })
}

/// An OTLP/HTTP error: `google.rpc.Status` in the request's encoding.
fn status(
    encoding: Encoding,
    http: StatusCode,
    grpc_code: i32,
    message: String,
    retry_after: Option<u64>,
) -> Response {
    let (content_type, body) = match encoding {
        Encoding::Protobuf => (
            "application/x-protobuf",
            proto::RpcStatus {
                code: grpc_code,
                message,
            }
            .encode_to_vec(),
        ),
        Encoding::Json => (
            "application/json",
            json!({"code": grpc_code, "message": message})
                .to_string()
                .into_bytes(),
        ),
    };
    let mut response = (http, [(header::CONTENT_TYPE, content_type)], body).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn refused(encoding: Encoding, refusal: Refusal) -> Response {
    let http = match refusal {
        Refusal::Unsupported(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        Refusal::Malformed(_) => StatusCode::BAD_REQUEST,
    };
    // INVALID_ARGUMENT: not retryable.
    status(encoding, http, 3, refusal.reason().to_string(), None)
}

/// The success response, with OTLP's partial success when some spans were refused.
fn accepted(encoding: Encoding, rejected: usize, error: Option<String>) -> Response {
    let partial = (rejected > 0).then(|| proto::ExportTracePartialSuccess {
        rejected_spans: rejected as i64,
        error_message: error.unwrap_or_default(),
    });
    match encoding {
        Encoding::Protobuf => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            proto::ExportTraceServiceResponse {
                partial_success: partial,
            }
            .encode_to_vec(),
        )
            .into_response(),
        Encoding::Json => {
            let body = match partial {
                Some(p) => {
                    json!({"partialSuccess": {"rejectedSpans": p.rejected_spans.to_string(), "errorMessage": p.error_message}})
                }
                None => json!({}),
            };
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response()
        }
    }
}

async fn ingest(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let text_header = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let encoding = match intake::encoding(text_header(header::CONTENT_TYPE)) {
        Ok(e) => e,
        Err(refusal) => return refused(Encoding::Json, refusal),
    };
    if !app.authorized(&headers, None) {
        return status(
            encoding,
            StatusCode::UNAUTHORIZED,
            16,
            "a valid `Authorization: Bearer TOKEN` header is required".into(),
            None,
        );
    }
    if let Some(rate) = &app.rate {
        if !rate.take() {
            return status(
                encoding,
                StatusCode::TOO_MANY_REQUESTS,
                8,
                format!("over {} requests per second; retry later", rate.per_second),
                Some(1),
            );
        }
    }
    let Ok(bytes) = axum::body::to_bytes(body, app.max_body).await else {
        return refused(
            encoding,
            Refusal::TooLarge(format!(
                "the body is larger than {} bytes (or was cut off)",
                app.max_body
            )),
        );
    };
    let content_encoding = text_header(header::CONTENT_ENCODING).map(str::to_string);
    let max_decoded = app.max_decoded;
    let intake = tokio::task::spawn_blocking(move || {
        let raw = intake::decompress(content_encoding.as_deref(), &bytes, max_decoded)?;
        let doc = intake::decode(encoding, &raw)?;
        intake::split(&doc)
    })
    .await;
    let intake = match intake {
        Ok(Ok(intake)) => intake,
        Ok(Err(refusal)) => return refused(encoding, refusal),
        Err(e) => {
            return status(
                encoding,
                StatusCode::INTERNAL_SERVER_ERROR,
                13,
                format!("reading the request failed: {e}"),
                None,
            )
        }
    };
    if intake.rows.is_empty() {
        return accepted(encoding, intake.rejected, intake.first_error);
    }
    let (reply, durable) = tokio::sync::oneshot::channel();
    let job = WriteJob {
        rows: intake.rows,
        reply,
    };
    if let Err(e) = app.jobs.try_send(job) {
        let message = match e {
            TrySendError::Full(_) => "the receiver is busy storing earlier spans; retry later",
            TrySendError::Disconnected(_) => "the receiver is shutting down; retry later",
        };
        return status(
            encoding,
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            message.into(),
            Some(1),
        );
    }
    match durable.await {
        Ok(Ok(_)) => accepted(encoding, intake.rejected, intake.first_error),
        Ok(Err(e)) => status(
            encoding,
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            format!("the spans could not be stored ({e}); nothing of this request was kept, retry later"),
            Some(1),
        ),
        Err(_) => status(
            encoding,
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            "the receiver stopped before storing the spans; retry later".into(),
            Some(1),
        ),
    }
}

type Params = Query<HashMap<String, String>>;

/// A page or API request without the token the receiver wants: 401 with the reason.
struct Unauthorized;

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        (
            StatusCode::UNAUTHORIZED,
            "a valid `Authorization: Bearer TOKEN` header or `?token=` is required\n",
        )
            .into_response()
    }
}

/// What a page's or the JSON API's read can fail with (the inbox, the store, their SQLite).
type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// Runs a blocking read of the inbox or the store off the async threads; a failure is a 500
/// with its reason.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ReadError> + Send + 'static,
) -> Result<T, Response> {
    let result = match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(e.into()),
    };
    result.map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response())
}

impl App {
    /// The token a page request carries (`?token=`, to be put back into its links), or
    /// `Unauthorized` when the receiver wants one and the request has none that matches.
    fn admit(
        &self,
        headers: &HeaderMap,
        query: &HashMap<String, String>,
    ) -> Result<Option<String>, Unauthorized> {
        let token = query.get("token").cloned();
        if self.authorized(headers, token.as_deref()) {
            Ok(token)
        } else {
            Err(Unauthorized)
        }
    }
}

async fn live_page(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Params) -> Response {
    let token = match app.admit(&headers, &q) {
        Ok(token) => token,
        Err(refused) => return refused.into_response(),
    };
    let page = blocking(move || {
        let inbox = Inbox::open_read_only(&app.inbox)?;
        let counts = inbox.counts()?;
        let rows = inbox.recent(app.page_rows)?;
        let suffix = token
            .map(|t| format!("?token={}", percent_encode(&t)))
            .unwrap_or_default();
        let index: Vec<view::IndexRow> = rows
            .iter()
            .map(|r| view::IndexRow {
                trace_id: r.trace_id.clone(),
                href: format!("traces/{}{suffix}", r.trace_id),
                detector: r.detector.clone(),
                verdict: r
                    .verdict
                    .clone()
                    .and_then(|v| serde_json::from_value::<detect::Verdict>(v).ok()),
                label: None,
            })
            .collect();
        let title = format!(
            "Live verdicts: {} traces diagnosed, {} open, {} spans received",
            counts.diagnosed, counts.open, counts.spans
        );
        Ok(view::refreshing(
            &view::index_page(&title, &index, &app.catalog),
            5,
        ))
    })
    .await;
    match page {
        Ok(html) => html_response(html),
        Err(r) => r,
    }
}

async fn trace_page(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    Query(q): Params,
) -> Response {
    let token = match app.admit(&headers, &q) {
        Ok(token) => token,
        Err(refused) => return refused.into_response(),
    };
    let page = blocking(move || {
        let found = Inbox::open_read_only(&app.inbox)?.verdict(&id)?;
        let spans = traces::Store::open_read_only(&app.store)?.spans(&id)?;
        if spans.is_empty() && found.is_none() {
            return Ok(None);
        }
        let answers: Vec<view::Answer> = found
            .and_then(|(row, transcript)| {
                let transcript = serde_json::from_str(&transcript?).ok()?;
                Some(view::Answer::from_transcript(row.detector, transcript))
            })
            .into_iter()
            .collect();
        let back = match &token {
            Some(t) => format!("../?token={}", percent_encode(t)),
            None => "../".to_string(),
        };
        Ok(Some(view::trace_page(&view::TracePage {
            trace_id: &id,
            spans: &spans,
            answers: &answers,
            catalog: &app.catalog,
            label: None,
            index_href: Some(&back),
        })))
    })
    .await;
    match page {
        Ok(Some(html)) => html_response(html),
        Ok(None) => (StatusCode::NOT_FOUND, "no such trace\n").into_response(),
        Err(r) => r,
    }
}

async fn verdicts_json(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Params,
) -> Response {
    if let Err(refused) = app.admit(&headers, &q) {
        return refused.into_response();
    }
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => app.page_rows,
        Some(Ok(n)) => n.min(10_000),
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "`limit` must be a whole number\n").into_response()
        }
    };
    let body = blocking(move || {
        let inbox = Inbox::open_read_only(&app.inbox)?;
        let counts = inbox.counts()?;
        let rows = inbox.recent(limit)?;
        Ok(json!({"counts": counts, "verdicts": rows}))
    })
    .await;
    match body {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}

async fn verdict_json(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    Query(q): Params,
) -> Response {
    if let Err(refused) = app.admit(&headers, &q) {
        return refused.into_response();
    }
    let body = blocking(move || {
        Ok(Inbox::open_read_only(&app.inbox)?
            .verdict(&id)?
            .map(|(row, transcript)| {
                let transcript: Option<serde_json::Value> =
                    transcript.and_then(|t| serde_json::from_str(&t).ok());
                json!({"verdict": row, "transcript": transcript})
            }))
    })
    .await;
    match body {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no verdict for this trace (yet)\n").into_response(),
        Err(r) => r,
    }
}

fn html_response(html: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// Percent-encodes everything but unreserved characters, for a token put back into a link.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
