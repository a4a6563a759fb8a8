//! The verdict on a 200 body: configuration, the incremental checker and the one-shot check.

use std::sync::Arc;

use crate::chunk::Chunk;
use crate::inspect::{self, Carry, Ctx, Judge};
use crate::lines::{LineSplitter, strip_boms};
use crate::redact::Redactor;
use crate::scan::{Scanner, Secret};
use crate::verdict::{Pass, Reason, Refusal, Verdict};

/// Which wire format the body is in; it decides where the model's identity is read (BND-4):
/// Chat Completions names its model in every chunk's top-level `model`, Anthropic Messages only
/// in `message_start`'s `message.model`.
use docsfab_record::Api;

/// The default for [`BoundaryConfig::max_line_bytes`]: far above any real event, low enough that
/// a body that never ends a line cannot hold unbounded memory.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// Why a configuration could not be built.
#[derive(Debug)]
pub enum ConfigError {
    /// The selected model name is empty, so no identity could ever match it.
    EmptyModel,
    /// The credential scanner could not be compiled.
    Scanner(aho_corasick::BuildError),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::EmptyModel => {
                f.write_str("the selected model is empty; name the model the route serves")
            }
            ConfigError::Scanner(e) => write!(f, "cannot build the credential scanner: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// What the boundary checks bodies against: the API, the selected model and the host's own
/// secrets. Build it once per route and provider; cloning it is cheap.
#[derive(Debug, Clone)]
pub struct BoundaryConfig {
    api: Api,
    model: Arc<str>,
    scanner: Arc<Scanner>,
    /// The same secrets, for text that is printed or recorded rather than judged.
    redactor: Arc<Redactor>,
    /// The same secrets once more, so two configurations can be compared.
    secrets: Arc<[Secret]>,
    max_line_bytes: usize,
}

/// Two configurations are equal when they judge every body alike: same API, model, secrets
/// and line limit. A verdict reached under one stands for the other.
impl PartialEq for BoundaryConfig {
    fn eq(&self, other: &Self) -> bool {
        self.api == other.api
            && self.model == other.model
            && self.max_line_bytes == other.max_line_bytes
            && (Arc::ptr_eq(&self.secrets, &other.secrets)
                || (self.secrets.len() == other.secrets.len()
                    && self
                        .secrets
                        .iter()
                        .zip(other.secrets.iter())
                        .all(|(a, b)| a.same_as(b))))
    }
}

impl Eq for BoundaryConfig {}

impl BoundaryConfig {
    /// `model` is the selected model, compared byte for byte with every model a body names.
    pub fn new(api: Api, model: &str, secrets: &[Secret]) -> Result<Self, ConfigError> {
        if model.is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        Ok(Self {
            api,
            model: model.into(),
            scanner: Arc::new(Scanner::new(secrets).map_err(ConfigError::Scanner)?),
            redactor: Arc::new(Redactor::from_secrets(secrets)),
            secrets: secrets.into(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        })
    }

    /// Refuses any body with a line longer than `max` bytes (line ending not counted).
    pub fn max_line_bytes(mut self, max: usize) -> Self {
        self.max_line_bytes = max;
        self
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The redactor for these secrets: what a caller prints or records of a provider's text
    /// goes through it.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Starts checking one body.
    pub fn start(&self) -> Boundary {
        Boundary::new(self)
    }

    /// Checks a whole body at once.
    pub fn check(&self, body: &[u8]) -> Verdict {
        let mut b = self.start();
        // The refusal, if any, is returned by finish.
        let _ = b.feed(body);
        b.finish()
    }
}

/// Checks one body incrementally: [`feed`](Self::feed) each network read in order, then
/// [`finish`](Self::finish). The verdict never depends on how the body was cut into reads
/// (BND-9).
#[derive(Debug)]
pub struct Boundary {
    lines: LineSplitter,
    state: State,
}

#[derive(Debug)]
pub(crate) struct State {
    config: BoundaryConfig,
    carry: Carry,
    refusal: Option<Refusal>,
    data_lines: u64,
    /// Data lines of the event being read: a blank line ends the event.
    event_data_lines: u64,
    error_events: u64,
    other_events: u64,
    /// Offset of the first `[DONE]`.
    done_at: Option<u64>,
    /// Offset of the first data line after the first `[DONE]` (BND-5).
    after_done_at: Option<u64>,
    /// Anthropic: a `message_start` naming the selected model has been seen.
    identified: bool,
}

impl Boundary {
    pub fn new(config: &BoundaryConfig) -> Self {
        Self {
            lines: LineSplitter::new(),
            state: State::new(config),
        }
    }

    /// Feeds one read. Returns the refusal as soon as one is decided; once refused, later reads
    /// are ignored and [`finish`](Self::finish) returns the same refusal.
    pub fn feed(&mut self, chunk: &[u8]) -> Option<&Refusal> {
        if self.state.refusal.is_none() {
            let state = &mut self.state;
            self.lines
                .feed_at(chunk, |line, at| state.line(line, at, None));
            self.state.pending(&self.lines);
        }
        self.state.refusal.as_ref()
    }

    /// The refusal decided so far, if any.
    pub fn refusal(&self) -> Option<&Refusal> {
        self.state.refusal.as_ref()
    }

    /// Ends the body (the last line is inspected even without a line ending, BND-9) and gives
    /// the verdict.
    pub fn finish(mut self) -> Verdict {
        if self.state.refusal.is_none() {
            let state = &mut self.state;
            self.lines.finish_at(|line, at| state.line(line, at, None));
        }
        self.state.verdict(self.lines.consumed())
    }
}

/// What a judged data line gave its reader: the chunk, when the judge parsed the line.
#[derive(Debug, Default)]
pub(crate) struct LineRead {
    pub chunk: Chunk,
    /// `Some(parsed as JSON)` when the judge parsed the line; `None` when it decided without
    /// parsing (a `[DONE]`, or a refusal before the parse).
    pub parsed: Option<bool>,
}

impl State {
    pub(crate) fn new(config: &BoundaryConfig) -> Self {
        State {
            config: config.clone(),
            carry: Carry::default(),
            refusal: None,
            data_lines: 0,
            event_data_lines: 0,
            error_events: 0,
            other_events: 0,
            done_at: None,
            after_done_at: None,
            identified: false,
        }
    }

    pub(crate) fn refused(&self) -> bool {
        self.refusal.is_some()
    }

    /// After a read: a line still open past the limit is refused now. Deciding before the line
    /// ends gives the same verdict as at its end, because the length check comes first there too.
    pub(crate) fn pending(&mut self, lines: &LineSplitter) {
        if self.refusal.is_none() && lines.pending() > self.config.max_line_bytes {
            let at = lines.consumed() - lines.pending() as u64;
            self.refuse(Reason::LineTooLong, at);
        }
    }

    fn refuse(&mut self, reason: Reason, offset: u64) {
        if self.refusal.is_none() {
            self.refusal = Some(Refusal { reason, offset });
        }
    }

    /// One line, without its ending, starting at `at` in the body. A data line's parse also
    /// fills `out`, when given.
    pub(crate) fn line(&mut self, line: &[u8], at: u64, out: Option<&mut LineRead>) {
        if self.refusal.is_some() {
            return;
        }
        if line.len() > self.config.max_line_bytes {
            return self.refuse(Reason::LineTooLong, at);
        }
        // Every line, whatever its field, is scanned raw: a key in a comment or an event name
        // leaves the host as surely as one in data.
        if let Some((pos, kind)) = self.config.scanner.find(line, true) {
            return self.refuse(Reason::CredentialMaterial(kind), at + pos as u64);
        }
        let line = strip_boms(line);
        if line.is_empty() {
            self.event_data_lines = 0;
            return; // an event boundary: nothing to judge on its own
        }
        if line[0] == b':' {
            return; // a comment, which does not end the event
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => self.data_line(value, at, out),
            b"event" | b"id" | b"retry" => {}
            _ => self.refuse(Reason::NotAStream, at),
        }
    }

    fn data_line(&mut self, value: &[u8], at: u64, out: Option<&mut LineRead>) {
        self.data_lines += 1;
        self.event_data_lines += 1;
        // BND-7 still parses this line alone below, but a second data line in one event makes
        // the event unreadable to every consumer, whatever each line holds.
        let joined = self.event_data_lines > 1;
        if self.done_at.is_some() && self.after_done_at.is_none() {
            self.after_done_at = Some(at);
        }
        if value == b"[DONE]" {
            if joined {
                return self.refuse(Reason::MultiLineDataEvent, at);
            }
            self.done_at.get_or_insert(at);
            return;
        }
        let config = &self.config;
        let (chunk, parsed_out) = match out {
            Some(o) => (Some(&mut o.chunk), Some(&mut o.parsed)),
            None => (None, None),
        };
        let mut ctx = Ctx {
            judge: Some(Judge {
                scanner: &config.scanner,
                model: &config.model,
                carry: &mut self.carry,
            }),
            chunk,
            facts: Default::default(),
            credential: None,
        };
        let parsed = inspect::inspect(value, &mut ctx);
        let (facts, credential) = (ctx.facts, ctx.credential);
        if let Some(p) = parsed_out {
            *p = Some(parsed.is_ok());
        }
        // A credential outranks a syntax error later in the same line: it is terminal.
        if let Some(kind) = credential {
            return self.refuse(Reason::CredentialMaterial(kind), at);
        }
        if parsed.is_err() {
            return self.refuse(Reason::UnparsableDataLine, at);
        }
        if !facts.is_object {
            return self.refuse(Reason::DataNotAnObject, at);
        }
        if facts.model_mismatch {
            return self.refuse(Reason::ModelMismatch, at);
        }
        // After the model check, so a line from another model is reported as such.
        if joined {
            return self.refuse(Reason::MultiLineDataEvent, at);
        }
        if facts.is_pure_error() {
            self.error_events += 1;
            return;
        }
        self.other_events += 1;
        let identified = match self.config.api {
            Api::OpenaiChat => facts.top_model,
            Api::AnthropicMessages => {
                if facts.message_start {
                    // A message_start must carry the identity itself.
                    self.identified = facts.message_model;
                }
                self.identified
            }
        };
        if !identified {
            self.refuse(Reason::MissingModelIdentity, at);
        }
    }

    pub(crate) fn verdict(self, body_len: u64) -> Verdict {
        if let Some(r) = self.refusal {
            return Verdict::Refuse(r);
        }
        if self.data_lines == 0 {
            return Verdict::Refuse(Refusal {
                reason: Reason::NoEvent,
                offset: body_len,
            });
        }
        if self.other_events > 0 {
            // Each of them was checked as it came.
            return Verdict::Pass(Pass::Stream);
        }
        // Only error events and [DONE]s: the identity check is skipped only when there is an
        // error event and nothing follows the first [DONE] (BND-2, BND-5).
        match (self.after_done_at, self.done_at) {
            (Some(at), _) => Verdict::Refuse(Refusal {
                reason: Reason::MissingModelIdentity,
                offset: at,
            }),
            (None, Some(at)) if self.error_events == 0 => Verdict::Refuse(Refusal {
                reason: Reason::MissingModelIdentity,
                offset: at,
            }),
            _ => Verdict::Pass(Pass::ErrorEventsOnly),
        }
    }
}
