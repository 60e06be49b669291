//! The HTTP/1.1 server of `sorft serve-reward` (hyper on a small tokio runtime).
//!
//! Requests are parsed on the I/O threads and scored on a pool of worker threads behind a bounded
//! queue: a full queue answers 503 at once (back-pressure), a request not scored within
//! `request_timeout` answers 504, a body over `max_body` 413, a body not received within
//! `read_timeout` 408, malformed JSON or wrong types 400. SIGTERM/SIGINT stop accepting, answer
//! 503 to new requests, let every accepted request finish (up to `shutdown_grace`), then return
//! the metrics. `GET /health` and `GET /metrics` (Prometheus text) report the state.

use super::{parse_request, response_json, BadRequest, RewardBatch, SampleScore, Scorer};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Errors that stop the server (not per-request errors, which are HTTP answers).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding or runtime set-up failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Settings of the server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// Worker threads scoring requests.
    pub workers: usize,
    /// Requests that may wait for a worker before new ones get 503.
    pub queue: usize,
    /// Largest request body in bytes (413 above).
    pub max_body: usize,
    /// Time allowed to receive a request's headers and body (408 after).
    pub read_timeout: Duration,
    /// Time allowed from a request's arrival to its answer (504 after).
    pub request_timeout: Duration,
    /// Open connections at most (503 above).
    pub max_connections: usize,
    /// Time allowed for accepted requests to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// I/O threads of the runtime.
    pub io_threads: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            workers: 2,
            queue: 256,
            max_body: 64 << 20,
            read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(130),
            io_threads: 2,
        }
    }
}

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0, 120.0,
];

/// Counters of the server's life, shown by `/metrics` and returned at shutdown.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reward requests received.
    pub requests: AtomicU64,
    /// Answered 200.
    pub ok: AtomicU64,
    /// Answered 400 (malformed or wrong types).
    pub bad_request: AtomicU64,
    /// Answered 408 (body too slow).
    pub read_timeout: AtomicU64,
    /// Answered 413 (body too large).
    pub too_large: AtomicU64,
    /// Answered 503 (queue full, too many connections, or shutting down).
    pub unavailable: AtomicU64,
    /// Answered 504 (not scored in time).
    pub timed_out: AtomicU64,
    /// Other answers (404, 405).
    pub other: AtomicU64,
    /// Rewards returned.
    pub rewards: AtomicU64,
    /// Requests waiting for a worker now.
    pub queued: AtomicUsize,
    /// Requests being scored now.
    pub scoring: AtomicUsize,
    /// Latency histogram of 200 answers (cumulative counts per bucket).
    latency: [AtomicU64; BUCKETS.len()],
    latency_sum_us: AtomicU64,
}

impl Metrics {
    fn observe(&self, secs: f64) {
        for (b, c) in BUCKETS.iter().zip(&self.latency) {
            if secs <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_sum_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn prometheus(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        s.push_str("# TYPE sorft_reward_requests_total counter\n");
        for (code, v) in [
            ("200", g(&self.ok)),
            ("400", g(&self.bad_request)),
            ("408", g(&self.read_timeout)),
            ("413", g(&self.too_large)),
            ("503", g(&self.unavailable)),
            ("504", g(&self.timed_out)),
            ("other", g(&self.other)),
        ] {
            s.push_str(&format!(
                "sorft_reward_requests_total{{code=\"{code}\"}} {v}\n"
            ));
        }
        s.push_str(&format!(
            "# TYPE sorft_rewards_total counter\nsorft_rewards_total {}\n",
            g(&self.rewards)
        ));
        s.push_str(&format!(
            "# TYPE sorft_reward_queue_depth gauge\nsorft_reward_queue_depth {}\n",
            self.queued.load(Ordering::Relaxed)
        ));
        s.push_str(&format!(
            "# TYPE sorft_reward_scoring gauge\nsorft_reward_scoring {}\n",
            self.scoring.load(Ordering::Relaxed)
        ));
        s.push_str("# TYPE sorft_reward_latency_seconds histogram\n");
        for (b, c) in BUCKETS.iter().zip(&self.latency) {
            s.push_str(&format!(
                "sorft_reward_latency_seconds_bucket{{le=\"{b}\"}} {}\n",
                g(c)
            ));
        }
        s.push_str(&format!(
            "sorft_reward_latency_seconds_bucket{{le=\"+Inf\"}} {}\n",
            g(&self.ok)
        ));
        s.push_str(&format!(
            "sorft_reward_latency_seconds_sum {}\nsorft_reward_latency_seconds_count {}\n",
            g(&self.latency_sum_us) as f64 / 1e6,
            g(&self.ok)
        ));
        s
    }
}

/// Why a queued job came back without scores.
enum JobError {
    /// Its deadline passed before a worker took it.
    Expired,
}

struct Job {
    batch: RewardBatch,
    deadline: Instant,
    reply: tokio::sync::oneshot::Sender<Result<Vec<SampleScore>, JobError>>,
}

struct State {
    cfg: ServeConfig,
    metrics: Arc<Metrics>,
    jobs: Mutex<Option<SyncSender<Job>>>,
    shutting_down: AtomicBool,
    connections: AtomicUsize,
    scorer: Arc<Scorer>,
}

type Answer = Response<Full<Bytes>>;

fn answer(status: StatusCode, body: serde_json::Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(state: &State, status: StatusCode, msg: impl Into<String>) -> Answer {
    let m = &state.metrics;
    let counter = match status.as_u16() {
        400 => &m.bad_request,
        408 => &m.read_timeout,
        413 => &m.too_large,
        503 => &m.unavailable,
        504 => &m.timed_out,
        _ => &m.other,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let mut r = answer(status, json!({ "error": msg.into() }));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    r
}

async fn route(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Answer, std::convert::Infallible> {
    let path = req.uri().path().to_string();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => answer(
            StatusCode::OK,
            json!({
                "status": if state.shutting_down.load(Ordering::Relaxed) { "shutting_down" } else { "ok" },
                "workers": state.cfg.workers,
                "queue_capacity": state.cfg.queue,
                "queued": state.metrics.queued.load(Ordering::Relaxed),
                "scoring": state.metrics.scoring.load(Ordering::Relaxed),
                "execution": state.scorer.executor.is_some(),
            }),
        ),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(state.metrics.prometheus())));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        (&Method::POST, "/" | "/get_reward" | "/reward") => reward(req, &state).await,
        (_, "/" | "/get_reward" | "/reward" | "/health" | "/metrics") => {
            error(&state, StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(
            &state,
            StatusCode::NOT_FOUND,
            format!("no route {path}; POST rewards to / (or /get_reward), GET /health, /metrics"),
        ),
    })
}

/// Reads the body within the size and time limits.
async fn read_body(req: Request<Incoming>, state: &State) -> Result<Bytes, Answer> {
    let max = state.cfg.max_body;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(error(
            state,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "body of {} bytes is over the limit of {max} bytes (--max-body-mb)",
                declared.unwrap_or(0)
            ),
        ));
    }
    let body = Limited::new(req.into_body(), max).collect();
    match tokio::time::timeout(state.cfg.read_timeout, body).await {
        Err(_) => Err(error(
            state,
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "body not received within {:?} (--read-timeout)",
                state.cfg.read_timeout
            ),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(error(
            state,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body is over the limit of {max} bytes (--max-body-mb)"),
        )),
        Ok(Err(e)) => Err(error(
            state,
            StatusCode::BAD_REQUEST,
            format!("reading the body: {e}"),
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

async fn reward(req: Request<Incoming>, state: &State) -> Answer {
    let t0 = Instant::now();
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    if state.shutting_down.load(Ordering::Relaxed) {
        return error(state, StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    let body = match read_body(req, state).await {
        Ok(b) => b,
        Err(a) => return a,
    };
    let batch = match parse_request(&body).and_then(|b| state.scorer.check(&b).map(|_| b)) {
        Ok(b) => b,
        Err(BadRequest(msg)) => return error(state, StatusCode::BAD_REQUEST, msg),
    };
    let n = batch.len();
    let deadline = t0 + state.cfg.request_timeout;
    let (tx, rx) = tokio::sync::oneshot::channel();
    // Counted before the send so that a worker's decrement never comes first.
    state.metrics.queued.fetch_add(1, Ordering::Relaxed);
    let sent = {
        let guard = state.jobs.lock().ok();
        match guard.as_ref().and_then(|g| g.as_ref()) {
            Some(s) => s.try_send(Job {
                batch,
                deadline,
                reply: tx,
            }),
            None => Err(TrySendError::Disconnected(Job {
                batch,
                deadline,
                reply: tx,
            })),
        }
    };
    if sent.is_err() {
        state.metrics.queued.fetch_sub(1, Ordering::Relaxed);
    }
    match sent {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            return error(
                state,
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "queue full ({} requests waiting); retry later",
                    state.cfg.queue
                ),
            )
        }
        Err(TrySendError::Disconnected(_)) => {
            return error(state, StatusCode::SERVICE_UNAVAILABLE, "shutting down")
        }
    }
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, rx).await {
        Ok(Ok(Ok(scores))) => {
            state.metrics.ok.fetch_add(1, Ordering::Relaxed);
            state.metrics.rewards.fetch_add(n as u64, Ordering::Relaxed);
            state.metrics.observe(t0.elapsed().as_secs_f64());
            answer(
                StatusCode::OK,
                response_json(&scores, state.scorer.executor.is_some()),
            )
        }
        Ok(Ok(Err(JobError::Expired))) | Err(_) => error(
            state,
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "not scored within {:?} (--request-timeout)",
                state.cfg.request_timeout
            ),
        ),
        Ok(Err(_)) => error(
            state,
            StatusCode::INTERNAL_SERVER_ERROR,
            "the worker scoring this request stopped",
        ),
    }
}

fn worker(rx: Arc<Mutex<Receiver<Job>>>, scorer: Arc<Scorer>, metrics: Arc<Metrics>) {
    loop {
        let job = {
            let Ok(guard) = rx.lock() else { return };
            match guard.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        metrics.queued.fetch_sub(1, Ordering::Relaxed);
        if Instant::now() > job.deadline {
            let _ = job.reply.send(Err(JobError::Expired));
            continue;
        }
        metrics.scoring.fetch_add(1, Ordering::Relaxed);
        let scores = scorer.score(&job.batch);
        metrics.scoring.fetch_sub(1, Ordering::Relaxed);
        let _ = job.reply.send(Ok(scores));
    }
}

/// Keeps SIGINT/SIGTERM for the server's graceful shutdown: the sandbox installs its own
/// clean-up-and-die handlers once per process when it first makes a workspace, so they are
/// installed now and then set back to the default before the runtime registers its own.
fn take_signals_from_sandbox() {
    crate::sandbox::cleanup::install_signal_handlers();
    // SAFETY: resetting two signals to their default action; no handler state is shared.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        what: what.to_string(),
        source,
    }
}

/// Serves until SIGTERM or SIGINT; `on_ready` hears the bound address once the server accepts.
/// Returns the metrics after every accepted request has been answered (or the grace has run out).
pub fn serve(
    cfg: ServeConfig,
    scorer: Scorer,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<Arc<Metrics>, ServeError> {
    take_signals_from_sandbox();
    let metrics = Arc::new(Metrics::default());
    let scorer = Arc::new(scorer);
    let (tx, rx) = sync_channel::<Job>(cfg.queue.max(1));
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..cfg.workers.max(1))
        .map(|i| {
            let (rx, s, m) = (rx.clone(), scorer.clone(), metrics.clone());
            std::thread::Builder::new()
                .name(format!("reward-worker-{i}"))
                .spawn(move || worker(rx, s, m))
                .map_err(io("starting a worker thread"))
        })
        .collect::<Result<_, _>>()?;
    let state = Arc::new(State {
        cfg: cfg.clone(),
        metrics: metrics.clone(),
        jobs: Mutex::new(Some(tx)),
        shutting_down: AtomicBool::new(false),
        connections: AtomicUsize::new(0),
        scorer,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.io_threads.max(1))
        .thread_name("reward-io")
        .enable_all()
        .build()
        .map_err(io("starting the I/O runtime"))?;
    let run = rt.block_on(accept_loop(state.clone(), on_ready));
    // Every accepted request is answered (or the grace ran out): close the queue, let the
    // workers finish what they hold.
    if let Ok(mut g) = state.jobs.lock() {
        g.take();
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    for w in workers {
        let _ = w.join();
    }
    run.map(|_| metrics)
}

async fn accept_loop(
    state: Arc<State>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let listener = tokio::net::TcpListener::bind(state.cfg.addr)
        .await
        .map_err(io(&format!("binding {}", state.cfg.addr)))?;
    let mut term = signal(SignalKind::terminate()).map_err(io("SIGTERM handler"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io("SIGINT handler"))?;
    on_ready(listener.local_addr().map_err(io("local address"))?);
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let _ = stream.set_nodelay(true);
        if state.connections.load(Ordering::Relaxed) >= state.cfg.max_connections {
            state.metrics.unavailable.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        }
        state.connections.fetch_add(1, Ordering::Relaxed);
        let st = state.clone();
        let svc = service_fn(move |req| route(req, st.clone()));
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(state.cfg.read_timeout)
            .serve_connection(TokioIo::new(stream), svc);
        let watched = graceful.watch(conn);
        let st = state.clone();
        tokio::spawn(async move {
            let _ = watched.await;
            st.connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
    state.shutting_down.store(true, Ordering::SeqCst);
    drop(listener);
    tracing::info!("shutting down: finishing accepted requests");
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(state.cfg.shutdown_grace) => {
            tracing::warn!("shutdown grace over with connections still open");
        }
    }
    Ok(())
}

/// Answers 503 on a connection over the limit and closes it.
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = r#"{"error":"too many open connections; retry later"}"#;
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(msg.as_bytes())).await;
}
