//! The HTTP surface: routes, error shapes, listeners (TCP or Unix socket) and lifecycles.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::api::{completion_json, ApiError, ChatRequest, ResponseMeta, Usage};
use crate::backend::{ChatBackend, RequestContext};
use crate::rng::SplitMix64;
use crate::{limits, sse, validate, CONTEXT_WINDOW, SCRIPT_HEADER};

/// Default limit on a request body: far above any prompt that fits the context window.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// A server that could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("server failed")]
    Serve(#[source] std::io::Error),
    #[error("the server thread ended before it was ready")]
    ThreadDied,
}

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    /// TCP on the loopback interface (`port` 0 picks a free port).
    pub fn loopback(port: u16) -> Listen {
        Listen::Tcp(SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: Listen,
    pub body_limit: usize,
    pub context_window: usize,
}

impl ServerConfig {
    pub fn new(listen: Listen) -> ServerConfig {
        ServerConfig {
            listen,
            body_limit: DEFAULT_BODY_LIMIT,
            context_window: CONTEXT_WINDOW,
        }
    }
}

#[derive(Clone)]
struct AppState {
    backend: Arc<dyn ChatBackend>,
    body_limit: usize,
    context_window: usize,
}

/// The router of the whole API; exposed so tests and embedders can serve it their own way.
pub fn router(config: &ServerConfig, backend: Arc<dyn ChatBackend>) -> Router {
    let state = AppState {
        backend,
        body_limit: config.body_limit,
        context_window: config.context_window,
    };
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

fn error_response(err: &ApiError) -> Response {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        err.body().to_string(),
    )
        .into_response()
}

fn json_response(value: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error_response(&ApiError::not_found(
        format!("Unknown request URL: {method} {uri}."),
        "unknown_url",
    ))
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error_response(&ApiError {
        status: 405,
        message: format!("Method {method} is not allowed for {uri}."),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed".into()),
    })
}

async fn health(State(state): State<AppState>) -> Response {
    json_response(json!({"status": "ok", "backend": state.backend.name()}))
}

async fn models(State(state): State<AppState>) -> Response {
    let data: Vec<Value> = state
        .backend
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "pathfinder"}))
        .collect();
    json_response(json!({"object": "list", "data": data}))
}

async fn chat(State(state): State<AppState>, headers: HeaderMap, request: Request) -> Response {
    let script_key = headers
        .get(SCRIPT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match axum::body::to_bytes(request.into_body(), state.body_limit).await {
        Ok(body) => body,
        Err(_) => {
            return error_response(&ApiError {
                status: 413,
                message: format!(
                    "The request body is larger than this server's limit of {} bytes.",
                    state.body_limit
                ),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_too_large".into()),
            })
        }
    };
    let ctx = RequestContext { script_key };
    let backend = state.backend.clone();
    let window = state.context_window;
    let outcome = tokio::task::spawn_blocking(move || respond(&*backend, &body, &ctx, window))
        .await
        .unwrap_or_else(|e| Err(ApiError::server(500, format!("the backend panicked: {e}"))));
    match outcome {
        Ok(reply) => reply,
        Err(err) => {
            tracing::info!(status = err.status, message = %err.message, "rejected request");
            error_response(&err)
        }
    }
}

/// Everything between the body and the response, blocking (the backend may be slow).
fn respond(
    backend: &dyn ChatBackend,
    body: &Bytes,
    ctx: &RequestContext,
    window: usize,
) -> Result<Response, ApiError> {
    let request = ChatRequest::parse(body)?;
    validate::request(&request)?;
    let prompt_tokens = validate::context_window(&request, window)?;
    let mut completion = backend.complete(&request, ctx)?;
    let completion_tokens = limits::apply(&request, &mut completion);
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
    };
    let meta = ResponseMeta {
        id: format!(
            "chatcmpl-{}",
            SplitMix64::new(completion.variation_seed ^ 0x5eed).hex(24)
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: request.model.clone(),
    };
    tracing::debug!(
        script = ctx.script_key.as_deref().unwrap_or("-"),
        prompt_tokens,
        completion_tokens,
        stream = request.streaming(),
        "completion"
    );
    if request.streaming() {
        let usage = request.include_usage().then_some(usage);
        let events = sse::events(&meta, &completion, usage);
        let stream = futures_util::stream::iter(
            events
                .into_iter()
                .map(|e| Ok::<Bytes, Infallible>(Bytes::from(e))),
        );
        Ok((
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(stream),
        )
            .into_response())
    } else {
        Ok((
            [(header::CONTENT_TYPE, "application/json")],
            completion_json(&meta, &completion, usage).to_string(),
        )
            .into_response())
    }
}

/// A bound listener and the base URL clients use for it.
enum Bound {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Bound {
    fn url(&self) -> String {
        match self {
            Bound::Tcp(l) => l
                .local_addr()
                .map(|a| format!("http://{a}"))
                .unwrap_or_else(|_| "http://127.0.0.1:?".into()),
            Bound::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }
}

fn remove_stale_socket(path: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| ServeError::Bind {
                addr: path.display().to_string(),
                source,
            })
        }
        Ok(_) => Err(ServeError::NotASocket {
            path: path.to_owned(),
        }),
        Err(_) => Ok(()),
    }
}

async fn bind(listen: &Listen) -> Result<Bound, ServeError> {
    match listen {
        Listen::Tcp(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Bound::Tcp)
            .map_err(|source| ServeError::Bind {
                addr: addr.to_string(),
                source,
            }),
        Listen::Unix(path) => {
            remove_stale_socket(path)?;
            tokio::net::UnixListener::bind(path)
                .map(|l| Bound::Unix(l, path.clone()))
                .map_err(|source| ServeError::Bind {
                    addr: path.display().to_string(),
                    source,
                })
        }
    }
}

async fn serve_bound(
    bound: Bound,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let result = match bound {
        Bound::Tcp(l) => axum::serve(l, app).with_graceful_shutdown(shutdown).await,
        Bound::Unix(l, path) => {
            let r = axum::serve(l, app).with_graceful_shutdown(shutdown).await;
            let _ = std::fs::remove_file(&path);
            r
        }
    };
    result.map_err(ServeError::Serve)
}

/// Serves in the foreground until Ctrl-C or SIGTERM; `on_ready` gets the base URL once
/// listening (what a client puts in `PATHFINDER_LLM_URL`).
pub fn run_blocking(
    config: ServerConfig,
    backend: Arc<dyn ChatBackend>,
    on_ready: impl FnOnce(&str),
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        let bound = bind(&config.listen).await?;
        on_ready(&bound.url());
        let app = router(&config, backend);
        serve_bound(bound, app, async {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = ctrl_c => {},
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {},
            }
        })
        .await
    })
}

/// A server on its own thread, for running agents in-process; stops when dropped.
pub struct BackgroundServer {
    url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl BackgroundServer {
    /// Binds (synchronously, so bind errors surface here) and starts serving.
    pub fn start(
        config: ServerConfig,
        backend: Arc<dyn ChatBackend>,
    ) -> Result<BackgroundServer, ServeError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<String, ServeError>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("llmserve".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(ServeError::Runtime)?;
                runtime.block_on(async move {
                    let bound = match bind(&config.listen).await {
                        Ok(b) => b,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let _ = ready_tx.send(Ok(bound.url()));
                    let app = router(&config, backend);
                    serve_bound(bound, app, async {
                        let _ = stop_rx.await;
                    })
                    .await
                })
            })
            .map_err(ServeError::Runtime)?;
        match ready_rx.recv() {
            Ok(Ok(url)) => Ok(BackgroundServer {
                url,
                shutdown: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(ServeError::ThreadDied),
            },
        }
    }

    /// The base URL: `http://127.0.0.1:PORT` or `unix:/path`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops serving and waits for the thread.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(ServeError::ThreadDied),
            None => Ok(()),
        }
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::warn!("llm server stopped with an error: {e}");
        }
    }
}
