//! OpenTelemetry traces and metrics of a run (docs/observability.md, "OpenTelemetry").
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set: then
//! [`Telemetry::from_env`] gives `None`, no exporter is built and the progress sink does no extra
//! work.
//!
//! When on, nothing changes inside the run. The progress sink stamps each event's wall-clock
//! time as it arrives ([`plan::Timeline`]); once the run is recorded, those times are joined
//! with the stored record (usage, rule, decision, classes, replays, tool calls) into the span
//! tree and metric points ([`plan::plan`]), and the OTLP exporters send them over
//! HTTP/protobuf on a thread of their own. The record stays the one account of what happened,
//! and a collector that is down or slow costs one warning line after the run, never the run:
//! the export starts after the record is committed, the span queue is bounded (the SDK's batch
//! processor), each request has the exporter's timeout and is not retried, and the export runs
//! beside the command's summary; the command waits for it at its very end
//! ([`wait_for_export`]), at most [`wait_bound`].

pub mod plan;

use std::io::Write as _;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use docsfab_boundary::redact::Redactor;
use docsfab_record::RunRecord;
use docsfab_runtime::executor::{Progress, RunConfig};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

use crate::app::error::CliError;
use plan::{MetricPoints, PlannedSpan, RunFacts, Timeline};

/// Which signals go out, read from the standard `OTEL_` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signals {
    pub traces: bool,
    /// Only when a metrics endpoint is set too (`OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`): a traces-only setup sends no metrics to a
    /// default port nobody named.
    pub metrics: bool,
    /// The endpoint the warning names.
    pub endpoint: String,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` (default 10 s): one export request's bound.
    pub timeout: Duration,
}

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
const PROTOCOLS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
];
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Signals {
    /// What `get` (the environment) asks for: `Ok(None)` when telemetry is off, `Err` with one
    /// sentence when a variable asks for something docsfab cannot do.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Signals>, String> {
        let set = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let off = |name: &str| set(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let Some((var, endpoint)) = [TRACES_ENDPOINT, ENDPOINT]
            .into_iter()
            .find_map(|v| set(v).map(|e| (v, e)))
        else {
            return Ok(None);
        };
        for name in [ENDPOINT, TRACES_ENDPOINT, METRICS_ENDPOINT] {
            if let Some(url) = set(name) {
                check_url(name, &url)?;
            }
        }
        for name in PROTOCOLS {
            if let Some(p) = set(name)
                && p.trim() != "http/protobuf"
            {
                return Err(format!(
                    "{name} is {p:?}, but docsfab exports OpenTelemetry only as http/protobuf; set {name}=http/protobuf or unset it."
                ));
            }
        }
        let timeout = match set("OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(ms) => ms.trim().parse().map(Duration::from_millis).map_err(|_| {
                format!(
                    "OTEL_EXPORTER_OTLP_TIMEOUT is {ms:?}, not a whole number of milliseconds; set it to one (for example 10000) or unset it."
                )
            })?,
        };
        Ok(Some(Signals {
            traces: !off("OTEL_TRACES_EXPORTER"),
            metrics: !off("OTEL_METRICS_EXPORTER")
                && (set(ENDPOINT).is_some() || set(METRICS_ENDPOINT).is_some()),
            endpoint: format!("{endpoint} ({var})"),
            timeout,
        }))
    }
}

fn check_url(name: &str, url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url.trim()) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(format!(
            "{name} is {url:?}, which is not an http:// or https:// URL; set it to the collector's OTLP/HTTP address (for example http://localhost:4318) or unset it."
        )),
    }
}

/// Refuses bad `OTEL_` settings (exit 2) before anything is opened or recorded.
pub fn check_env() -> Result<(), CliError> {
    let get = |name: &str| std::env::var(name).ok();
    Signals::from_vars(&get)
        .map(|_| ())
        .map_err(CliError::bad_input)
}

/// The run's telemetry while it goes: the timeline the progress sink fills and what the export
/// needs from the run's configuration.
pub struct Telemetry {
    signals: Signals,
    timeline: Mutex<Timeline>,
    facts: RunFacts,
}

impl Telemetry {
    /// `Ok(None)` when telemetry is off; bad `OTEL_` settings are bad input (exit 2), found
    /// before the run starts.
    pub fn from_env(config: &RunConfig) -> Result<Option<Arc<Telemetry>>, CliError> {
        let get = |name: &str| std::env::var(name).ok();
        let Some(signals) = Signals::from_vars(&get).map_err(CliError::bad_input)? else {
            return Ok(None);
        };
        let p = &config.provider;
        let redactor = match &p.api_key {
            Some(key) => Arc::new(Redactor::new(&[key.expose()])),
            None => Arc::default(),
        };
        let server = reqwest::Url::parse(&p.base_url)
            .ok()
            .and_then(|u| Some((u.host_str()?.to_owned(), u.port_or_known_default()?)));
        Ok(Some(Arc::new(Telemetry {
            signals,
            timeline: Mutex::new(Timeline::default()),
            facts: RunFacts {
                api: p.api,
                model: p.model.clone(),
                server,
                redactor,
            },
        })))
    }

    /// Stamps a progress event with the time it arrived.
    pub fn observe(&self, event: &Progress) {
        let now = SystemTime::now();
        if let Ok(mut t) = self.timeline.lock() {
            t.observe(event, now);
        }
    }

    /// Exports the recorded run and waits for it, at most [`wait_bound`]: for `docsfab serve`,
    /// whose job thread is its own and runs many runs (so the one-export-per-process
    /// [`Telemetry::start_export`] does not fit). `Err` is the warning's reason, redacted.
    pub fn export_and_wait(&self, record: &RunRecord) -> Result<(), String> {
        let outcome = self
            .spawn_export(record)
            .and_then(|rx| receive(&rx, wait_bound(&self.signals)));
        outcome.map_err(|why| {
            self.facts.redactor.line(&format!(
                "OpenTelemetry export to {} failed: {why}",
                self.signals.endpoint
            ))
        })
    }

    /// Starts exporting the recorded run on a thread of its own and returns at once, so the
    /// command's summary and timing do not wait for the collector; [`wait_for_export`], at
    /// the end of the command, waits for it (bounded).
    pub fn start_export(&self, record: &RunRecord) {
        let result = self.spawn_export(record);
        let pending = Pending {
            bound: if result.is_ok() {
                wait_bound(&self.signals)
            } else {
                Duration::ZERO
            },
            result,
            endpoint: self.signals.endpoint.clone(),
            redactor: Arc::clone(&self.facts.redactor),
        };
        if let Ok(mut slot) = PENDING.lock() {
            *slot = Some(pending);
        }
    }

    /// Plans the run's spans and points and sends them from a thread of its own; the receiver
    /// gets the export's result.
    fn spawn_export(
        &self,
        record: &RunRecord,
    ) -> Result<mpsc::Receiver<Result<(), String>>, String> {
        let run_end = SystemTime::now();
        let (span, points) = match self.timeline.lock() {
            Ok(t) => plan::plan(record, &t, &self.facts, run_end),
            Err(_) => return Err("the run's timeline was lost".to_owned()),
        };
        let signals = self.signals.clone();
        let (tx, rx) = mpsc::channel();
        // Not a task of the async runtime: the OTLP exporters use reqwest's blocking client,
        // which must not run (or be dropped) on one of its threads, and the runtime ends with
        // the run.
        std::thread::Builder::new()
            .name("docsfab-otel".into())
            .spawn(move || {
                let _ = tx.send(export_blocking(&signals, span, points));
            })
            .map_err(|e| format!("cannot start the export thread ({e})"))?;
        Ok(rx)
    }
}

/// The export's result, waiting at most `bound` for it.
fn receive(rx: &mpsc::Receiver<Result<(), String>>, bound: Duration) -> Result<(), String> {
    match rx.recv_timeout(bound) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Err(format!("no answer within {} s", bound.as_secs()))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the export thread ended without a result".to_owned())
        }
    }
}

/// An export under way: where its result will come, how long to wait for it, and what the
/// warning needs.
struct Pending {
    result: Result<mpsc::Receiver<Result<(), String>>, String>,
    bound: Duration,
    endpoint: String,
    redactor: Arc<Redactor>,
}

/// The export the command started, if any (one run per process).
static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Waits for the export the command started, at most its bound. Never fails: a failed or
/// unanswered export is one warning line on stderr. Does nothing when nothing was exported.
pub fn wait_for_export() {
    let Some(p) = PENDING.lock().ok().and_then(|mut slot| slot.take()) else {
        return;
    };
    let outcome = p.result.and_then(|rx| receive(&rx, p.bound));
    if let Err(why) = outcome {
        let line = format!(
            "warning: OpenTelemetry export to {} failed: {why}; the run and its record are not affected.",
            p.endpoint
        );
        // Not eprintln!: a closed stderr must not fail the command.
        let _ = writeln!(std::io::stderr(), "{}", p.redactor.line(&line));
    }
}

/// The longest the CLI waits for the export: one request's timeout for each signal, plus a
/// second for the rest.
pub fn wait_bound(s: &Signals) -> Duration {
    s.timeout * 2 + Duration::from_secs(1)
}

/// Builds the exporters, sends the spans and the metric points, shuts down. `Err` names what
/// failed, in one short clause per signal.
fn export_blocking(s: &Signals, span: PlannedSpan, points: MetricPoints) -> Result<(), String> {
    // The workspace builds reqwest with `rustls-no-provider`; an https:// collector needs this.
    docsfab_provider::transport::install_crypto_provider();
    let resource = resource();
    let mut failures = Vec::new();
    if s.traces
        && let Err(e) = export_traces(&span, resource.clone())
    {
        failures.push(format!("traces: {e}"));
    }
    if s.metrics
        && let Err(e) = export_metrics(&points, resource)
    {
        failures.push(format!("metrics: {e}"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// `service.name` is `docsfab` unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) names
/// another; the SDK reads both.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if named {
        builder.build()
    } else {
        builder.with_service_name("docsfab").build()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("docsfab")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The most spans one run's export queues (a run with more loses the rest, counted by the SDK).
const MAX_QUEUE: usize = 65_536;

fn export_traces(span: &PlannedSpan, resource: Resource) -> Result<(), String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| e.to_string())?;
    // The whole tree is ended at once, faster than any collector takes it: unless the
    // operator sized the queue, it holds the run's spans (bounded all the same).
    let mut batch = BatchConfigBuilder::default();
    if std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
        batch = batch.with_max_queue_size(span.count().clamp(2048, MAX_QUEUE));
    }
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch.build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer_with_scope(scope());
    emit(&tracer, span, &Context::new());
    // Shutdown drops the export's result; the flush reports it.
    let flushed = provider.force_flush();
    let _ = provider.shutdown();
    flushed.map_err(|e| innermost(&e.to_string()).to_owned())
}

/// The exporter's own words inside the SDK's wrapping (`Operation failed: errs:
/// [Err(InternalFailure("HTTP export failed: network error"))]` reads `network error`).
fn innermost(message: &str) -> &str {
    let inner = match message.rfind("(\"") {
        Some(at) => {
            let rest = &message[at + 2..];
            rest.find("\")").map_or(rest, |end| &rest[..end])
        }
        None => message,
    };
    inner.strip_prefix("HTTP export failed: ").unwrap_or(inner)
}

/// One planned span and its subtree, children ended before their parent.
fn emit(tracer: &SdkTracer, s: &PlannedSpan, parent: &Context) {
    let builder = tracer
        .span_builder(s.name.clone())
        .with_kind(s.kind.clone())
        .with_start_time(s.start)
        .with_attributes(s.attributes.clone());
    let cx = parent.with_span(tracer.build_with_context(builder, parent));
    let span = cx.span();
    for e in &s.events {
        span.add_event_with_timestamp(e.name, e.at, e.attributes.clone());
    }
    if s.failed {
        span.set_status(Status::error(""));
    }
    for child in &s.children {
        emit(tracer, child, &cx);
    }
    span.end_with_timestamp(s.end);
}

/// Bucket bounds the GenAI semantic conventions advise for each histogram.
const DURATION_BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

fn export_metrics(points: &MetricPoints, resource: Resource) -> Result<(), String> {
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| e.to_string())?;
    let provider = SdkMeterProvider::builder()
        .with_periodic_exporter(exporter)
        .with_resource(resource)
        .build();
    let meter = provider.meter_with_scope(scope());
    let duration = meter
        .f64_histogram("gen_ai.client.operation.duration")
        .with_unit("s")
        .with_description("Duration of each chat request of the run, replays included.")
        .with_boundaries(DURATION_BOUNDS.to_vec())
        .build();
    let tokens = meter
        .u64_histogram("gen_ai.client.token.usage")
        .with_unit("{token}")
        .with_description("Input and output tokens of each chat request.")
        .with_boundaries(TOKEN_BOUNDS.to_vec())
        .build();
    let replays = meter
        .u64_counter("docsfab.replays")
        .with_unit("{replay}")
        .with_description("In-turn replays of a provider request, by class.")
        .build();
    let retries = meter
        .u64_counter("docsfab.step_retries")
        .with_unit("{retry}")
        .with_description("Step retries scheduled, by failure class and rule.")
        .build();
    let steps = meter
        .u64_counter("docsfab.steps")
        .with_unit("{step}")
        .with_description("Steps of the run, by whether they were reused from an earlier run.")
        .build();
    for attrs in &points.steps {
        steps.add(1, attrs);
    }
    for (v, attrs) in &points.durations {
        duration.record(*v, attrs);
    }
    for (v, attrs) in &points.tokens {
        tokens.record(*v, attrs);
    }
    for attrs in &points.replays {
        replays.add(1, attrs);
    }
    for attrs in &points.step_retries {
        retries.add(1, attrs);
    }
    // Cumulative points: a flush and then the shutdown's own final collection would send them
    // twice, so the shutdown alone exports them. It only says whether that worked.
    provider.shutdown().map_err(|_| "not delivered".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The variables of `pairs` as the environment.
    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn issue13_the_warning_quotes_the_exporter_not_the_sdk_wrapping() {
        let wrapped = r#"Operation failed: errs: [Err(InternalFailure("HTTP export failed: network error"))]"#;
        assert_eq!(innermost(wrapped), "network error");
        assert_eq!(innermost("timed out"), "timed out");
    }

    #[test]
    fn issue13_telemetry_is_off_without_an_endpoint_variable() {
        assert_eq!(Signals::from_vars(&vars(&[])), Ok(None));
        let only_service = vars(&[("OTEL_SERVICE_NAME", "x"), (METRICS_ENDPOINT, "http://h:1")]);
        assert_eq!(Signals::from_vars(&only_service), Ok(None));
        let disabled = vars(&[(ENDPOINT, "http://h:4318"), ("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(Signals::from_vars(&disabled), Ok(None));
    }

    #[test]
    fn issue13_either_endpoint_turns_it_on_and_metrics_need_their_own() {
        let all = Signals::from_vars(&vars(&[(ENDPOINT, "http://h:4318")]))
            .unwrap()
            .unwrap();
        assert!(all.traces && all.metrics);
        assert_eq!(all.timeout, DEFAULT_TIMEOUT);
        let traces = Signals::from_vars(&vars(&[(TRACES_ENDPOINT, "http://h:4318/v1/traces")]))
            .unwrap()
            .unwrap();
        assert!(traces.traces && !traces.metrics);
        let no_metrics = Signals::from_vars(&vars(&[
            (ENDPOINT, "http://h:4318"),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ]))
        .unwrap()
        .unwrap();
        assert!(no_metrics.traces && !no_metrics.metrics);
        assert_eq!(no_metrics.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn issue13_bad_otel_settings_are_refused_in_one_sentence() {
        let grpc = vars(&[
            (ENDPOINT, "http://h:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        let e = Signals::from_vars(&grpc).unwrap_err();
        assert!(e.contains("only as http/protobuf"), "{e}");
        let url = Signals::from_vars(&vars(&[(ENDPOINT, "localhost:4318")])).unwrap_err();
        assert!(
            url.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT is \"localhost:4318\""),
            "{url}"
        );
        let timeout = vars(&[
            (ENDPOINT, "http://h"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ]);
        assert!(
            Signals::from_vars(&timeout)
                .unwrap_err()
                .contains("milliseconds")
        );
        let fine = vars(&[
            (ENDPOINT, "https://h"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]);
        assert!(Signals::from_vars(&fine).unwrap().is_some());
    }
}
