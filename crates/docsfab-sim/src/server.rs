//! The listening server, the request log and `docsfab sim serve`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_record::Api;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::SimError;
use crate::cache::{BilledUsage, CacheUse, PromptCache};
use crate::capacity::{Limiter, OutsideCounts, Refusal, Verdict};
use crate::http::{self, Ending, Framing, Outgoing, ReadError};
use crate::render::{self, Bill, BodyFacts, Rendered, RequestInfo};
use crate::scenario::{Action, CloseHow, Pick, Scenario, StreamOptions, UsageReports};

/// One line of the request log: one request the simulator received in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestLogEntry {
    /// 0-based arrival order (requests are numbered when their body has been read).
    pub index: usize,
    /// When the request had been read, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    pub method: String,
    /// The request path without its query string.
    pub path: String,
    /// SHA-256 of the exact request body bytes, lowercase hex.
    pub sha256: String,
    /// The body's `model`, when the body is a JSON object that has one.
    pub model: Option<String>,
    /// The body's `stream` (false when absent or unreadable).
    pub stream: bool,
    /// The scenario entry that answered, e.g. `responses[0]#3`, `fallback`, `no-route` for a
    /// request to a path the simulator does not serve, or [`CAPACITY_ENTRY`] for a request
    /// refused with 429 because the scenario's capacity was used up (neither consumes the
    /// script).
    pub entry: String,
    /// The simulator's estimate of the prompt's tokens (body bytes / 4, at least 1): what the
    /// token budget is charged under `tokens: prompt`, so a benchmark can work out a token floor.
    /// 0 when read from a log written before the field existed.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// What a provider modelled by the simulator bills for the request (see [`BilledUsage`]).
    /// All zero when read from a log written before the field existed.
    #[serde(default)]
    pub billed: BilledUsage,
}

/// The request log's `entry` for a request over the scenario's capacity.
pub const CAPACITY_ENTRY: &str = "capacity (429)";

/// The request log's `entry` for an OpenAI request refused with 400 for its `stream_options`
/// member under the scenario's `stream_options: refuse`.
pub const STREAM_OPTIONS_ENTRY: &str = "stream_options (400)";

struct Shared {
    scenario: Scenario,
    state: Mutex<LogState>,
    /// Live copies of log entries for [`SimServer::subscribe`].
    feed: broadcast::Sender<RequestLogEntry>,
}

/// How many log entries a slow subscriber may fall behind before it misses some.
const FEED_CAPACITY: usize = 1024;

struct LogState {
    next_script_index: u64,
    /// The next index in each lane's script.
    lane_next: Vec<u64>,
    entries: Vec<RequestLogEntry>,
    file: Option<std::fs::File>,
    /// The capacity's buckets. Behind the log's lock, so a request is numbered and charged in
    /// one step and the log order is the order in which capacity was spent.
    limiter: Option<Limiter>,
    /// The server-wide prompt cache, filled in log order.
    cache: PromptCache,
}

/// What a numbered request is answered with.
enum Route {
    /// A path (or method) the simulator does not serve; `Some` when the path is served.
    Unserved(Option<Api>),
    /// Over capacity: 429, and the script is not consumed.
    Refused(Api, Verdict, Refusal),
    /// An OpenAI `stream_options` member under `stream_options: refuse`: 400, and neither the
    /// script nor the capacity is touched.
    StreamOptions,
    /// The script's entry, with the capacity's state when the scenario has one.
    Script(Api, Pick, Option<Verdict>),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A panic while holding the lock cannot leave the log half-updated in a way that matters
        // more than losing the server, so keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running simulator. Dropping it stops the server too; [`SimServer::shutdown`] also waits for
/// the connections to end.
pub struct SimServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl SimServer {
    /// Binds (use "127.0.0.1:0" for a free port) and starts serving in a background task.
    ///
    /// Only loopback addresses are accepted. The log file, when given, is created (or truncated)
    /// and gets one JSON line per request.
    pub async fn start(
        addr: SocketAddr,
        scenario: Scenario,
        log_path: Option<PathBuf>,
    ) -> Result<SimServer, SimError> {
        if !addr.ip().is_loopback() {
            return Err(SimError::NotLoopback { addr });
        }
        let file = match &log_path {
            None => None,
            Some(path) => {
                Some(
                    std::fs::File::create(path).map_err(|source| SimError::LogFile {
                        path: path.clone(),
                        source,
                    })?,
                )
            }
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| SimError::Bind { addr, source })?;
        let lanes = scenario.lane_count();
        let limiter = scenario
            .capacity()
            .map(|c| Limiter::new(c, tokio::time::Instant::now()));
        let shared = Arc::new(Shared {
            scenario,
            state: Mutex::new(LogState {
                next_script_index: 0,
                lane_next: vec![0; lanes],
                entries: Vec::new(),
                file,
                limiter,
                cache: PromptCache::default(),
            }),
            feed: broadcast::channel(FEED_CAPACITY).0,
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), stopped));
        Ok(SimServer {
            addr: local,
            shared,
            stop,
            task: Some(task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients use: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The request log so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestLogEntry> {
        self.shared.lock().entries.clone()
    }

    /// A live feed of request log entries, each sent as its request is numbered (before it is
    /// answered). Only requests that arrive after the call are seen; a receiver that falls more
    /// than 1024 entries behind gets `RecvError::Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<RequestLogEntry> {
        self.shared.feed.subscribe()
    }

    /// What the scenario's outside client (`capacity.outsideShare`) got, with its arrivals played
    /// up to now; `None` when the scenario has none. Its requests are not in the request log.
    pub fn outside_client(&self) -> Option<OutsideCounts> {
        self.shared
            .lock()
            .limiter
            .as_mut()?
            .outside(tokio::time::Instant::now())
    }

    /// Stops accepting, ends every open connection and waits for the server task.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

async fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    // Each SSE event should leave as its own segment, as a real provider's would.
    let _ = stream.set_nodelay(true);
    let request = match http::read_request(&mut stream).await {
        Ok(request) => request,
        Err(ReadError::Closed) => return,
        Err(ReadError::Malformed(why)) => {
            let out = plain_error(400, why);
            write_plain(&mut stream, &out).await;
            close(stream).await;
            return;
        }
    };
    let api = match request.path.as_str() {
        "/v1/chat/completions" => Some(Api::OpenaiChat),
        "/v1/messages" => Some(Api::AnthropicMessages),
        _ => None,
    };
    let facts = BodyFacts::read(&request.body, api);
    let (index, route, rendered) = route_and_log(&shared, &request, api, &facts);

    let (api, pick, limits) = match route {
        Route::Unserved(served) => {
            let out = if served.is_some() {
                plain_error(405, "use POST")
            } else {
                plain_error(
                    404,
                    "the simulator serves POST /v1/chat/completions and POST /v1/messages",
                )
            };
            write_plain(&mut stream, &out).await;
            close(stream).await;
            return;
        }
        Route::StreamOptions => {
            write_plain(&mut stream, &render::stream_options_refusal()).await;
            close(stream).await;
            return;
        }
        Route::Refused(api, verdict, refusal) => {
            let capacity = shared
                .scenario
                .capacity()
                .expect("a refusal comes from the scenario's capacity");
            let out = render::capacity_refusal(api, capacity, &verdict, refusal, &facts);
            write_plain(&mut stream, &out).await;
            close(stream).await;
            return;
        }
        Route::Script(api, pick, limits) => (api, pick, limits),
    };
    let step = pick.step;
    if step.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
    }
    let ending = match (&step.action, rendered) {
        (Action::Respond(response), Some(Rendered { mut out, bill })) => {
            let limits = shared.scenario.capacity().zip(limits.as_ref());
            render::finish_headers(&mut out, response, api, limits);
            let (mut peer, mut wire) = stream.split();
            let written = http::write_response(
                &mut wire,
                &out,
                response.stall,
                response.cut,
                Some(&mut peer),
            )
            .await;
            // The client went away before the body's end: bill what had been sent by then.
            let gone_at = written.hung_up_at.or(match written.ending {
                Ending::PeerGone => Some(written.sent),
                _ => None,
            });
            if let Some(at) = gone_at {
                let total: u64 = out.pieces.iter().map(|p| p.len() as u64).sum();
                let scripted = response.cut.map_or(u64::MAX, |c| c.after_bytes);
                if at < total && at < scripted {
                    rebill(&shared, index, &bill, at);
                }
            }
            written.ending
        }
        (Action::Drop(how), _) => Ending::Cut(*how),
        // `route_and_log` renders every response it routes to the script.
        (Action::Respond(_), None) => Ending::Complete,
    };
    match ending {
        Ending::Complete | Ending::Cut(CloseHow::Close) => close(stream).await,
        Ending::Cut(CloseHow::Reset) => reset(stream),
        Ending::PeerGone => {}
    }
}

/// Writes a response that has no stall, cut or client to watch.
async fn write_plain(stream: &mut TcpStream, out: &Outgoing) {
    http::write_response(stream, out, None, None, None::<&mut TcpStream>).await;
}

/// Corrects a logged request's `billed` when its client went away after `delivered` body bytes.
/// Only the in-memory log changes: the log file's line and the live feed were written when the
/// request was numbered, with what the scripted response bills.
fn rebill(shared: &Shared, index: usize, bill: &Bill, delivered: u64) {
    let billed = bill.billed(Some(delivered));
    if let Some(entry) = shared.lock().entries.get_mut(index) {
        entry.billed = billed;
    }
}

/// Routes the request and logs it, under the log's lock: its number, its route, the prompt
/// cache's part and, for a scripted response, its rendered body and what it bills.
fn route_and_log(
    shared: &Shared,
    request: &http::Request,
    api: Option<Api>,
    facts: &BodyFacts,
) -> (usize, Route, Option<Rendered>) {
    let routed = api.filter(|_| request.method == "POST");
    let sha256 = hex::encode(Sha256::digest(&request.body));
    let mut state = shared.lock();
    let index = state.entries.len();
    let lane = shared.scenario.lane_for(&request.body);
    let route = route(&shared.scenario, &mut state, api, routed, facts, lane);
    let mut rendered = None;
    let mut billed = BilledUsage::default();
    if let Route::Script(api, pick, _) = &route {
        // Only a request whose prompt the provider processes reads and fills the cache; a status
        // answer is a refusal.
        let cache = if render::processes_prompt(&pick.step) {
            state.cache.lookup_and_insert(&facts.cache)
        } else {
            CacheUse::default()
        };
        let info = RequestInfo {
            api: *api,
            index,
            body: facts.clone(),
            cache,
            report_usage: *api == Api::AnthropicMessages
                || shared.scenario.usage_reports() == UsageReports::Reported,
        };
        match &pick.step.action {
            Action::Drop(_) => billed = Bill::prompt_only(&info),
            Action::Respond(response) => {
                let r = render::render(response, &info);
                billed = r.bill.billed(response.cut.map(|c| c.after_bytes));
                rendered = Some(r);
            }
        }
    }
    let entry = RequestLogEntry {
        index,
        time_unix_ms: unix_ms(),
        method: request.method.clone(),
        path: request.path.clone(),
        sha256,
        model: facts.model.clone(),
        stream: facts.stream,
        entry: match &route {
            Route::Unserved(_) => "no-route".to_owned(),
            Route::Refused(..) => CAPACITY_ENTRY.to_owned(),
            Route::StreamOptions => STREAM_OPTIONS_ENTRY.to_owned(),
            Route::Script(_, pick, _) => pick.label.clone(),
        },
        prompt_tokens: render::input_estimate(facts),
        billed,
    };
    if let Some(file) = state.file.as_mut() {
        // The log is a test aid: a full disk must not take the simulator down with it.
        if let Ok(line) = serde_json::to_string(&entry) {
            let _ = writeln!(file, "{line}").and_then(|()| file.flush());
        }
    }
    // No subscriber is the common case, not an error.
    let _ = shared.feed.send(entry.clone());
    state.entries.push(entry);
    (index, route, rendered)
}

/// Picks the answer for a numbered request and, when the scenario has a capacity, charges it.
/// Runs under the log's lock. A refused request leaves the script where it was, so the script
/// describes what the provider does with the requests it lets through.
fn route(
    scenario: &Scenario,
    state: &mut LogState,
    api: Option<Api>,
    routed: Option<Api>,
    facts: &BodyFacts,
    lane: Option<usize>,
) -> Route {
    let Some(api) = routed else {
        return Route::Unserved(api);
    };
    if api == Api::OpenaiChat
        && facts.has_stream_options
        && scenario.stream_options() == StreamOptions::Refuse
    {
        return Route::StreamOptions;
    }
    let next = match lane {
        Some(i) => state.lane_next[i],
        None => state.next_script_index,
    };
    let pick = scenario.pick_in(lane, next);
    let verdict = state
        .limiter
        .as_mut()
        .zip(scenario.capacity())
        .map(|(limiter, capacity)| {
            limiter.admit(
                tokio::time::Instant::now(),
                render::token_cost(&pick.step, facts, capacity.tokens),
            )
        });
    if let Some(v) = verdict
        && let Some(refusal) = v.refused
    {
        return Route::Refused(api, v, refusal);
    }
    match lane {
        Some(i) => state.lane_next[i] += 1,
        None => state.next_script_index += 1,
    }
    Route::Script(api, pick, verdict)
}

/// An orderly close: FIN, then wait (briefly) for the client to close its side. Dropping a socket
/// that still has unread input makes the kernel send RST, which would turn a scripted clean close
/// into a reset; draining first keeps `close` a close.
async fn close(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 1024];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_DRAIN, drain).await;
}

/// How long a closed connection waits for the client's side to close.
const CLOSE_DRAIN: Duration = Duration::from_secs(1);

/// Closes with RST instead of FIN: `SO_LINGER` with a zero timeout makes the close abortive.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

fn plain_error(status: u16, message: &str) -> Outgoing {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    Outgoing {
        status,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        pieces: vec![body.to_string().into_bytes()],
        framing: Framing::ContentLength,
        piece_delay: Duration::ZERO,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What `docsfab sim serve --listen ADDR --scenario FILE [--log FILE]` runs: starts the server,
/// prints `listening on http://ADDR/v1` as the first line of stdout (flushed), serves until
/// Ctrl-C / SIGTERM.
pub async fn serve_command(
    listen: SocketAddr,
    scenario: &Path,
    log: Option<&Path>,
) -> Result<(), SimError> {
    let scenario = Scenario::load(scenario)?;
    // Installed before the `listening on` line, so a supervisor that signals as soon as it reads
    // the line still gets a clean shutdown rather than the default action.
    let signals = ShutdownSignals::install()?;
    let server = SimServer::start(listen, scenario, log.map(Path::to_path_buf)).await?;
    let mut feed = server.subscribe();
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {}", server.base_url()).map_err(SimError::Stdout)?;
        stdout.flush().map_err(SimError::Stdout)?;
    }
    // One line per request on stderr for whoever watches; stdout stays the address alone. Not
    // eprintln!: a closed stderr must not panic the narrator.
    let narrator = tokio::spawn(async move {
        loop {
            let line = match feed.recv().await {
                Ok(e) => describe(&e),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    format!("({missed} requests not shown)")
                }
                Err(broadcast::error::RecvError::Closed) => break,
            };
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    });
    signals.wait().await;
    narrator.abort();
    // The outside client's requests are not in the log, so say at the end what it took.
    if let Some(counts) = server.outside_client() {
        let _ = writeln!(std::io::stderr(), "{}", describe_outside(counts));
    }
    server.shutdown().await;
    Ok(())
}

/// The stderr line `sim serve` prints at the end when the scenario has an outside client.
fn describe_outside(c: OutsideCounts) -> String {
    format!(
        "outside client (capacity.outsideShare): {} requests admitted, {} refused",
        c.admitted, c.refused
    )
}

/// The stderr line `sim serve` prints for a request.
fn describe(e: &RequestLogEntry) -> String {
    format!(
        "#{} {} {} model={} stream={} -> {}",
        e.index,
        e.method,
        e.path,
        e.model.as_deref().unwrap_or("-"),
        e.stream,
        e.entry
    )
}

#[cfg(unix)]
struct ShutdownSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl ShutdownSignals {
    fn install() -> Result<Self, SimError> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            interrupt: signal(SignalKind::interrupt()).map_err(SimError::Signal)?,
            terminate: signal(SignalKind::terminate()).map_err(SimError::Signal)?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

#[cfg(not(unix))]
struct ShutdownSignals;

#[cfg(not(unix))]
impl ShutdownSignals {
    fn install() -> Result<Self, SimError> {
        Ok(ShutdownSignals)
    }

    async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_serve_ends_with_what_the_outside_client_took() {
        let counts = OutsideCounts {
            admitted: 3,
            refused: 1,
        };
        assert_eq!(
            describe_outside(counts),
            "outside client (capacity.outsideShare): 3 requests admitted, 1 refused"
        );
    }
}
