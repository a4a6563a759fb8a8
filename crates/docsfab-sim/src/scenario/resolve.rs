//! Checking the raw scenario and resolving it: each entry's one response kind, statuses, bodies,
//! headers and stream faults checked, the seeded random models expanded into a fixed list, and the
//! fallback, lanes, capacity and top-level settings read.

use std::collections::BTreeMap;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::raw::{
    RawAnswer, RawBurst, RawCapacity, RawEntry, RawFallback, RawLane, RawRandom, RawScenario,
    RawStreamError, RawThrottle, ScalarText,
};
use super::{
    Action, Answer, Bom, CloseHow, ErrorEvent, Fallback, Lane, LineEnding, LineFraming, Quirk,
    Reply, Response, Scenario, Slot, StatusBody, StatusReply, Step, StreamErrorReply, StreamFaults,
    StreamOptions, ToolCall, UsageReports,
};
use crate::capacity::{Capacity, CapacitySpec};
use crate::rng::SplitMix64;

/// Repeats are counted, not copied, but random models are expanded entry by entry: cap the
/// expansion so a typo in `episodes` cannot exhaust memory.
const MAX_EXPANDED_ENTRIES: usize = 100_000;

/// The one response kind an entry names.
enum Kind {
    Status(u16),
    Drop(CloseHow),
    Answer(Box<RawAnswer>),
    StreamError(RawStreamError),
    Random,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Status(_) => "status",
            Kind::Drop(_) => "drop",
            Kind::Answer(_) => "answer",
            Kind::StreamError(_) => "stream_error",
            Kind::Random => "random",
        }
    }
}

/// Why a scenario is refused, and where.
pub(super) struct Invalid {
    pub(super) line: Option<u64>,
    pub(super) message: String,
}

type Checked<T> = Result<T, Invalid>;

/// The one response kind an entry gives (status, drop, answer, stream_error or random), taken
/// out of it.
fn one_kind(entry: &mut RawEntry, line: u64) -> Checked<Kind> {
    let mut kinds: Vec<Kind> = Vec::with_capacity(1);
    kinds.extend(entry.status.take().map(Kind::Status));
    kinds.extend(entry.drop.take().map(Kind::Drop));
    kinds.extend(entry.answer.take().map(|a| Kind::Answer(Box::new(a))));
    kinds.extend(entry.stream_error.take().map(Kind::StreamError));
    if entry.random.is_some() {
        kinds.push(Kind::Random);
    }
    match kinds.len() {
        1 => Ok(kinds.remove(0)),
        0 => invalid(
            line,
            "the entry has no response kind: give exactly one of status, drop, answer, stream_error, random",
        ),
        _ => {
            let names: Vec<&str> = kinds.iter().map(Kind::name).collect();
            invalid(
                line,
                format!(
                    "the entry has several response kinds ({}); give exactly one",
                    names.join(", ")
                ),
            )
        }
    }
}

/// A status entry's body: one text (chunked or not) or timed chunks.
fn status_body(
    status: u16,
    body: Option<String>,
    chunks: Option<Vec<String>>,
    chunked: Option<bool>,
    chunk_delay_ms: Option<u64>,
    line: u64,
) -> Checked<StatusBody> {
    if !(200..=999).contains(&status) {
        return invalid(
            line,
            format!("status {status} is not a final HTTP status (200..999)"),
        );
    }
    match (body, chunks) {
        (Some(_), Some(_)) => invalid(line, "give body or chunks, not both"),
        (_, Some(_)) if chunked == Some(false) => {
            invalid(line, "chunks are always sent chunked; drop chunked: false")
        }
        (_, Some(items)) => Ok(StatusBody::Chunks {
            items,
            delay_ms: chunk_delay_ms.unwrap_or(0),
        }),
        (_, None) if chunk_delay_ms.is_some() => invalid(line, "chunk_delay_ms needs chunks"),
        (text, None) => Ok(StatusBody::Single {
            text,
            chunked: chunked.unwrap_or(false),
        }),
    }
}

/// A response header: name and value.
type Header = (String, String);

/// Checks the raw scenario and turns it into the resolved one, counting what it expands.
#[derive(Default)]
pub(super) struct Resolver {
    expanded: usize,
}

fn invalid<T>(line: u64, message: impl Into<String>) -> Checked<T> {
    Err(Invalid {
        line: Some(line),
        message: message.into(),
    })
}

/// For each slot, how many requests the script answers up to and including it.
fn script_ends(slots: &[Slot]) -> Vec<u64> {
    let mut ends = Vec::with_capacity(slots.len());
    let mut total: u64 = 0;
    for slot in slots {
        total += u64::from(slot.repeat);
        ends.push(total);
    }
    ends
}

/// `capacity:` checked into the simulator's rate limit.
fn checked_capacity(spanned: Spanned<RawCapacity>) -> Checked<Capacity> {
    let c = spanned.value;
    Capacity::check(CapacitySpec {
        requests_per_minute: c.requests_per_minute,
        tokens_per_minute: c.tokens_per_minute,
        burst: c.burst,
        time_scale: c.time_scale,
        limit_header: c.limit_header,
        headers: c.headers,
        retry_after: c.retry_after,
        token_burst_seconds: c.token_burst_seconds,
        tokens: c.tokens,
        outside_share: c.outside_share,
    })
    .or_else(|m| invalid(spanned.referenced.line(), m))
}

/// `usage:`: whether the provider reports usage as the API does (`reported`, the default) or,
/// as some OpenAI-compatible servers, never (`never`).
fn checked_usage(raw: Option<Spanned<String>>) -> Checked<UsageReports> {
    let Some(spanned) = raw else {
        return Ok(UsageReports::Reported);
    };
    match spanned.value.as_str() {
        "reported" => Ok(UsageReports::Reported),
        "never" => Ok(UsageReports::Never),
        other => invalid(
            spanned.referenced.line(),
            format!("usage must be reported or never, not {other}"),
        ),
    }
}

/// `stream_options:`: whether an OpenAI request that has a `stream_options` member is answered
/// (`accept`, the default) or refused with a 400 (`refuse`).
fn checked_stream_options(raw: Option<Spanned<String>>) -> Checked<StreamOptions> {
    let Some(spanned) = raw else {
        return Ok(StreamOptions::Accept);
    };
    match spanned.value.as_str() {
        "accept" => Ok(StreamOptions::Accept),
        "refuse" => Ok(StreamOptions::Refuse),
        other => invalid(
            spanned.referenced.line(),
            format!("stream_options must be accept or refuse, not {other}"),
        ),
    }
}

impl Resolver {
    pub(super) fn scenario(&mut self, raw: RawScenario) -> Checked<Scenario> {
        let mut slots = Vec::new();
        for (i, entry) in raw.responses.into_iter().enumerate() {
            self.entry(entry, format!("responses[{i}]"), &mut slots)?;
        }
        let ends = script_ends(&slots);
        let total = ends.last().copied().unwrap_or(0);
        let fallback = self.fallback(raw.fallback, &slots, total)?;
        let capacity = raw.capacity.map(checked_capacity).transpose()?;
        let mut lanes = Vec::with_capacity(raw.lanes.len());
        for spanned in raw.lanes {
            lanes.push(self.lane(spanned)?);
        }
        Ok(Scenario {
            name: raw.name,
            slots,
            ends,
            fallback,
            capacity,
            lanes,
            usage: checked_usage(raw.usage)?,
            stream_options: checked_stream_options(raw.stream_options)?,
        })
    }

    /// What answers the requests past the script: `fallback:` as written, or the last scripted
    /// response repeated when it is left out. `total` is how many requests the script answers.
    fn fallback(
        &mut self,
        raw: Option<Spanned<RawFallback>>,
        slots: &[Slot],
        total: u64,
    ) -> Checked<Fallback> {
        let empty = || Invalid {
            line: None,
            message:
                "responses is empty: script at least one response or set `fallback: {respond: ...}`"
                    .to_owned(),
        };
        let repeat_last = || slots.last().cloned().map(Fallback::RepeatLast);
        let Some(spanned) = raw else {
            return repeat_last().ok_or_else(empty);
        };
        let line = spanned.referenced.line();
        match spanned.value {
            RawFallback::RepeatLast => repeat_last().ok_or_else(empty),
            RawFallback::Cycle => NonZeroU64::new(total)
                .map(Fallback::Cycle)
                .ok_or_else(empty),
            RawFallback::Respond(entry) => {
                let entry_line = entry.referenced.line();
                let entry = entry.value;
                if entry.random.is_some() {
                    return invalid(line, "fallback.respond cannot be a random model");
                }
                if entry.repeat.is_some() {
                    return invalid(
                        entry_line,
                        "fallback.respond takes no repeat: it answers every request past the script",
                    );
                }
                Ok(Fallback::Respond(Arc::new(self.step(entry, entry_line)?)))
            }
        }
    }

    fn lane(&mut self, spanned: Spanned<RawLane>) -> Checked<Lane> {
        let line = spanned.referenced.line();
        let raw = spanned.value;
        if raw.contains.is_empty() {
            return invalid(
                line,
                "lanes[].contains is empty: give the text that marks this lane's requests",
            );
        }
        let script = self
            .scenario(RawScenario {
                name: None,
                responses: raw.responses,
                fallback: raw.fallback,
                capacity: None,
                lanes: Vec::new(),
                usage: None,
                stream_options: None,
            })
            .map_err(|e| Invalid {
                line: e.line.or(Some(line)),
                message: format!("in the lane for {:?}: {}", raw.contains, e.message),
            })?;
        Ok(Lane {
            contains: raw.contains,
            script,
        })
    }

    fn entry(
        &mut self,
        spanned: Spanned<RawEntry>,
        index_label: String,
        out: &mut Vec<Slot>,
    ) -> Checked<()> {
        let line = spanned.referenced.line();
        let mut entry = spanned.value;
        let label = match entry.name.take() {
            Some(name) if name.trim().is_empty() || name.chars().any(char::is_control) => {
                return invalid(
                    line,
                    "name must be non-empty text without control characters",
                );
            }
            Some(name) => name,
            None => index_label,
        };
        if let Some(random) = entry.random.take() {
            return self.random(entry, random, line, &label, out);
        }
        let repeat = match entry.repeat {
            Some(0) => return invalid(line, "repeat must be at least 1"),
            Some(n) => n,
            None => 1,
        };
        let step = self.step(entry, line)?;
        self.push(
            out,
            Slot {
                label,
                repeat,
                step: Arc::new(step),
            },
            line,
        )
    }

    fn push(&mut self, out: &mut Vec<Slot>, slot: Slot, line: u64) -> Checked<()> {
        self.expanded += 1;
        if self.expanded > MAX_EXPANDED_ENTRIES {
            return invalid(
                line,
                format!(
                    "the scenario expands to more than {MAX_EXPANDED_ENTRIES} entries; use repeat or fewer episodes"
                ),
            );
        }
        out.push(slot);
        Ok(())
    }

    /// Checks a non-random entry and builds what it does.
    fn step(&mut self, mut entry: RawEntry, line: u64) -> Checked<Step> {
        let kind = one_kind(&mut entry, line)?;
        let name = kind.name();
        if !matches!(kind, Kind::Status(_)) {
            for (field, set) in [
                ("body", entry.body.is_some()),
                ("chunked", entry.chunked.is_some()),
                ("chunks", entry.chunks.is_some()),
                ("chunk_delay_ms", entry.chunk_delay_ms.is_some()),
            ] {
                if set {
                    return invalid(
                        line,
                        format!("{field} is only allowed with status, not with {name}"),
                    );
                }
            }
        }
        let delay_ms = entry.delay_ms.unwrap_or(0);
        let reply = match kind {
            Kind::Random => {
                return invalid(line, "a random model cannot be nested here");
            }
            Kind::Drop(how) => {
                for (field, set) in [
                    ("headers", entry.headers.is_some()),
                    ("stall", entry.stall.is_some()),
                    ("cut", entry.cut.is_some()),
                ] {
                    if set {
                        return invalid(
                            line,
                            format!("{field} is not allowed with drop: nothing is sent"),
                        );
                    }
                }
                return Ok(Step {
                    delay_ms,
                    action: Action::Drop(how),
                });
            }
            Kind::Status(status) => {
                let body = status_body(
                    status,
                    entry.body.take(),
                    entry.chunks.take(),
                    entry.chunked,
                    entry.chunk_delay_ms,
                    line,
                )?;
                Reply::Status(StatusReply { status, body })
            }
            Kind::Answer(answer) => Reply::Answer(Box::new(
                resolve_answer(*answer).or_else(|m| invalid(line, m))?,
            )),
            Kind::StreamError(raw) => Reply::StreamError(StreamErrorReply {
                event: ErrorEvent {
                    kind: raw.kind,
                    code: raw.code,
                    message: raw.message,
                },
                done: raw.done,
                framing: line_framing(raw.line_ending, raw.bom, raw.chunk_bytes, raw.split_crlf)
                    .or_else(|m| invalid(line, m))?,
            }),
        };
        let headers = match entry.headers {
            None => Vec::new(),
            Some(map) => {
                let mut headers = Vec::with_capacity(map.len());
                for (name, ScalarText(value)) in map {
                    check_header(&name, &value).or_else(|m| invalid(line, m))?;
                    headers.push((name, value));
                }
                headers
            }
        };
        Ok(Step {
            delay_ms,
            action: Action::Respond(Response {
                reply,
                headers,
                stall: entry.stall,
                cut: entry.cut,
            }),
        })
    }

    fn random(
        &mut self,
        entry: RawEntry,
        random: RawRandom,
        line: u64,
        label: &str,
        out: &mut Vec<Slot>,
    ) -> Checked<()> {
        alone_with_random(&entry, line)?;
        if random.episodes == 0 {
            return invalid(line, "random.episodes must be at least 1");
        }
        if random.burst.is_none() && random.throttle.is_none() {
            return invalid(line, "random needs burst, throttle or both");
        }
        if let Some(burst) = &random.burst {
            check_burst(burst, line)?;
        }
        let throttle = match &random.throttle {
            None => None,
            Some(t) => Some(throttle_model(t, random.burst.is_some(), line)?),
        };
        let then_line = random.then.referenced.line();
        let then = random.then.value;
        if then.random.is_some() {
            return invalid(then_line, "random.then cannot itself be a random model");
        }
        let then_repeat = match then.repeat {
            Some(0) => return invalid(then_line, "repeat must be at least 1"),
            Some(n) => n,
            None => 1,
        };
        let then_step = Arc::new(self.step(then, then_line)?);

        let mut rng = SplitMix64::new(random.seed);
        let mut fault_steps: BTreeMap<(u16, Option<Header>), Arc<Step>> = BTreeMap::new();
        let mut fault = |status: u16, header: Option<Header>| {
            Arc::clone(
                fault_steps
                    .entry((status, header.clone()))
                    .or_insert_with(|| Arc::new(bare_status(status, header))),
            )
        };
        for episode in 0..random.episodes {
            let throttled = match (&throttle, &random.burst) {
                (Some(t), Some(_)) => rng.chance(t.chance),
                (Some(_), None) => true,
                (None, _) => false,
            };
            let mut faults: Vec<Arc<Step>> = Vec::new();
            if let (true, Some(t)) = (throttled, &throttle) {
                loop {
                    let header = if t.retry_after.is_empty() {
                        None
                    } else {
                        t.retry_after[rng.below(t.retry_after.len() as u64) as usize].clone()
                    };
                    faults.push(fault(429, header));
                    if faults.len() as u32 >= t.max_run || !rng.chance(t.persistence) {
                        break;
                    }
                }
            } else if let Some(burst) = &random.burst {
                let [min, max] = burst.length;
                let length = min + rng.below(u64::from(max - min) + 1) as u32;
                for _ in 0..length {
                    let status = burst.statuses[rng.below(burst.statuses.len() as u64) as usize];
                    faults.push(fault(status, None));
                }
            }
            for (k, step) in faults.into_iter().enumerate() {
                self.push(
                    out,
                    Slot {
                        label: format!("{label}.episode[{episode}].fault[{k}]"),
                        repeat: 1,
                        step,
                    },
                    line,
                )?;
            }
            self.push(
                out,
                Slot {
                    label: format!("{label}.episode[{episode}].then"),
                    repeat: then_repeat,
                    step: Arc::clone(&then_step),
                },
                line,
            )?;
        }
        Ok(())
    }
}

/// A random model's entry holds nothing else: its responses go in `random.then`.
fn alone_with_random(entry: &RawEntry, line: u64) -> Checked<()> {
    let others = [
        ("repeat", entry.repeat.is_some()),
        ("delay_ms", entry.delay_ms.is_some()),
        ("status", entry.status.is_some()),
        ("drop", entry.drop.is_some()),
        ("answer", entry.answer.is_some()),
        ("stream_error", entry.stream_error.is_some()),
        ("body", entry.body.is_some()),
        ("chunked", entry.chunked.is_some()),
        ("chunks", entry.chunks.is_some()),
        ("chunk_delay_ms", entry.chunk_delay_ms.is_some()),
        ("headers", entry.headers.is_some()),
        ("stall", entry.stall.is_some()),
        ("cut", entry.cut.is_some()),
    ];
    match others.iter().find(|(_, set)| *set) {
        Some((field, _)) => invalid(
            line,
            format!(
                "{field} is not allowed next to random (use episodes, and put responses in random.then)"
            ),
        ),
        None => Ok(()),
    }
}

/// A fault a random model draws: the status with an empty body, and its Retry-After if any.
fn bare_status(status: u16, header: Option<Header>) -> Step {
    Step {
        delay_ms: 0,
        action: Action::Respond(Response {
            reply: Reply::Status(StatusReply {
                status,
                body: StatusBody::Single {
                    text: None,
                    chunked: false,
                },
            }),
            headers: header.into_iter().collect(),
            stall: None,
            cut: None,
        }),
    }
}

/// Checks a random model's burst: a sane length range and final HTTP statuses.
fn check_burst(burst: &RawBurst, line: u64) -> Checked<()> {
    let [min, max] = burst.length;
    if min > max {
        return invalid(
            line,
            format!("random.burst.length [{min}, {max}]: min is above max"),
        );
    }
    if max > 10_000 {
        return invalid(line, "random.burst.length max must be at most 10000");
    }
    if burst.statuses.is_empty() {
        return invalid(line, "random.burst.statuses must name at least one status");
    }
    if let Some(bad) = burst.statuses.iter().find(|s| !(200..=999).contains(*s)) {
        return invalid(
            line,
            format!("random.burst.statuses: {bad} is not a final HTTP status"),
        );
    }
    Ok(())
}

/// A random model's throttle runs, checked.
struct ThrottleModel {
    /// The chance that an episode is a throttle run (1 when there is no burst to choose from).
    chance: f64,
    /// The chance that a throttle run goes on after each 429.
    persistence: f64,
    /// The longest throttle run.
    max_run: u32,
    /// The Retry-After headers to draw from for each 429 (`None`: no header).
    retry_after: Vec<Option<Header>>,
}

fn throttle_model(t: &RawThrottle, with_burst: bool, line: u64) -> Checked<ThrottleModel> {
    let chance = match (t.chance, with_burst) {
        (Some(c), _) => c,
        (None, false) => 1.0,
        (None, true) => {
            return invalid(
                line,
                "random.throttle.chance is required when burst is also given (the chance that an episode is a throttle run)",
            );
        }
    };
    for (field, p) in [("chance", chance), ("persistence", t.persistence)] {
        if !(0.0..=1.0).contains(&p) {
            return invalid(
                line,
                format!("random.throttle.{field} must be between 0 and 1, not {p}"),
            );
        }
    }
    let max_run = t.max_run.unwrap_or(23);
    if max_run == 0 || max_run > 10_000 {
        return invalid(line, "random.throttle.max_run must be between 1 and 10000");
    }
    let mut retry_after: Vec<Option<Header>> = Vec::new();
    for ScalarText(v) in &t.retry_after {
        if v.is_empty() {
            retry_after.push(None);
        } else {
            check_header("retry-after", v).or_else(|m| invalid(line, m))?;
            retry_after.push(Some(("retry-after".to_owned(), v.clone())));
        }
    }
    for ms in &t.retry_after_ms {
        retry_after.push(Some(("retry-after-ms".to_owned(), ms.to_string())));
    }
    Ok(ThrottleModel {
        chance,
        persistence: t.persistence,
        max_run,
        retry_after,
    })
}

fn resolve_answer(raw: RawAnswer) -> Result<Answer, String> {
    let content = match (raw.text, raw.json) {
        (Some(_), Some(_)) => return Err("answer takes text or json, not both".to_owned()),
        (Some(text), None) => Some(text),
        (None, Some(value)) => Some(value.to_string()),
        (None, None) => None,
    };
    let deltas = nonzero(raw.deltas, "answer.deltas")?;
    let mut tool_calls = Vec::with_capacity(raw.tool_calls.len());
    for call in raw.tool_calls {
        if call.name.is_empty() {
            return Err("answer.tool_calls: name must not be empty".to_owned());
        }
        let arguments = match call.arguments {
            None => "{}".to_owned(),
            // A string is sent verbatim, so a scenario can send arguments that are not JSON.
            Some(serde_json::Value::String(s)) => s,
            Some(value) => value.to_string(),
        };
        tool_calls.push(ToolCall {
            id: call.id,
            name: call.name,
            arguments,
            deltas: nonzero(call.deltas, "answer.tool_calls.deltas")?,
            truncate_at: call.truncate_arguments,
        });
    }
    if raw.quirks.contains(&Quirk::ErrorFieldLine) && raw.error_event.is_none() {
        return Err("answer.quirks: error-field-line needs an error_event to send".to_owned());
    }
    if let Some(reason) = &raw.finish_reason
        && reason.is_empty()
    {
        return Err("answer.finish_reason must not be empty (use omit_finish_reason)".to_owned());
    }
    Ok(Answer {
        content,
        deltas,
        tool_calls,
        finish_reason: raw.finish_reason,
        usage: raw.usage,
        model: raw.model,
        faults: StreamFaults {
            omit_finish_reason: raw.omit_finish_reason,
            omit_done: raw.omit_done,
            error_event: raw.error_event,
            framing: line_framing(raw.line_ending, raw.bom, raw.chunk_bytes, raw.split_crlf)?,
            foreign_model: raw.foreign_model,
            after_done: raw.after_done,
            event_delay_ms: raw.event_delay_ms,
            quirks: raw.quirks,
        },
    })
}

fn line_framing(
    line_ending: LineEnding,
    bom: Option<Bom>,
    chunk_bytes: Option<usize>,
    split_crlf: bool,
) -> Result<LineFraming, String> {
    if let Some(bom) = &bom {
        check_bom(bom)?;
    }
    let chunk_bytes = match chunk_bytes {
        None => None,
        Some(n) => Some(NonZeroUsize::new(n).ok_or("chunk_bytes must be at least 1")?),
    };
    Ok(LineFraming {
        line_ending,
        bom,
        chunk_bytes,
        split_crlf,
    })
}

fn nonzero(value: Option<usize>, field: &str) -> Result<NonZeroUsize, String> {
    match value {
        None => Ok(NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN)),
        Some(n) => NonZeroUsize::new(n).ok_or_else(|| format!("{field} must be at least 1")),
    }
}

fn check_bom(bom: &Bom) -> Result<(), String> {
    if bom.count == 0 || bom.count > 16 {
        return Err("bom.count must be between 1 and 16".to_owned());
    }
    Ok(())
}

/// Header names must be HTTP tokens and values must not break the response head.
fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!(
            "header name {name:?} is not a valid HTTP header name"
        ));
    }
    if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
        return Err(format!(
            "header {name}: the value must not contain CR, LF or NUL"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower == "content-length" || lower == "transfer-encoding" || lower == "connection" {
        return Err(format!(
            "header {name} is set by the simulator (it frames the body); use chunked or cut instead"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (label, status, headers) of every scripted entry that answers with a status.
    fn statuses(s: &Scenario) -> Vec<(String, u16, Vec<Header>)> {
        s.slots
            .iter()
            .filter_map(|slot| match &slot.step.action {
                Action::Respond(Response {
                    reply: Reply::Status(reply),
                    headers,
                    ..
                }) => Some((slot.label.clone(), reply.status, headers.clone())),
                _ => None,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The expansion of a random model keeps every promise the format makes, for any seed.
        #[test]
        fn random_models_keep_their_bounds(
            seed in any::<u64>(),
            episodes in 1u32..30,
            min in 0u32..6,
            extra in 0u32..6,
            chance in 0.0f64..=1.0,
            persistence in 0.0f64..=1.0,
            max_run in 1u32..30,
        ) {
            let max = min + extra;
            let yaml = format!(
                "responses:\n  - random:\n      seed: {seed}\n      episodes: {episodes}\n      \
                 burst: {{length: [{min}, {max}], statuses: [408, 503]}}\n      \
                 throttle: {{chance: {chance}, persistence: {persistence}, max_run: {max_run}, \
                 retry_after: ['2', ''], retry_after_ms: [150]}}\n      then: {{status: 200}}\n"
            );
            let s = Scenario::from_yaml_str(&yaml, "prop").unwrap();
            let again = Scenario::from_yaml_str(&yaml, "prop").unwrap();
            prop_assert_eq!(statuses(&s), statuses(&again));

            let all = statuses(&s);
            prop_assert_eq!(all.iter().filter(|(l, ..)| l.ends_with(".then")).count(), episodes as usize);
            for e in 0..episodes {
                let prefix = format!("responses[0].episode[{e}].fault[");
                let faults: Vec<_> = all.iter().filter(|(l, ..)| l.starts_with(&prefix)).collect();
                let throttled = faults.iter().any(|(_, status, _)| *status == 429);
                if throttled {
                    prop_assert!(faults.iter().all(|(_, status, _)| *status == 429));
                    prop_assert!((1..=max_run as usize).contains(&faults.len()));
                    for (_, _, headers) in &faults {
                        let allowed: [&[Header]; 3] = [
                            &[],
                            &[("retry-after".to_owned(), "2".to_owned())],
                            &[("retry-after-ms".to_owned(), "150".to_owned())],
                        ];
                        prop_assert!(allowed.contains(&headers.as_slice()), "{:?}", headers);
                    }
                } else {
                    prop_assert!((min as usize..=max as usize).contains(&faults.len()));
                    prop_assert!(faults.iter().all(|(_, status, h)| [408, 503].contains(status) && h.is_empty()));
                }
            }
        }
    }

    #[test]
    fn persistence_one_runs_to_max_run_and_zero_stops_at_one() {
        let run = |persistence: f64| {
            let yaml = format!(
                "responses:\n  - random:\n      seed: 3\n      episodes: 5\n      \
                 throttle: {{persistence: {persistence}, max_run: 9}}\n      then: {{status: 200}}\n"
            );
            let s = Scenario::from_yaml_str(&yaml, "p").unwrap();
            statuses(&s)
                .iter()
                .filter(|(_, status, _)| *status == 429)
                .count()
        };
        assert_eq!(run(1.0), 5 * 9);
        assert_eq!(run(0.0), 5);
    }
}
