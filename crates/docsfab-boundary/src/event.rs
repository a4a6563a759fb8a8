//! One pass over a 200 body that gives both the boundary's verdict and the decoded events a
//! stream reader needs: each line is split once, and each data line is parsed once, by the
//! boundary's own visitor, which also gathers the line's [`Chunk`].
//!
//! Events are dispatched exactly as [`SseDecoder`](crate::SseDecoder) dispatches them (at a
//! blank line, or at the end for an unterminated final event), and the verdict is the one
//! [`BoundaryConfig::check`] gives for the whole body, whatever the reads.

use std::borrow::Cow;

use crate::boundary::{BoundaryConfig, LineRead, State};
use crate::chunk::Chunk;
use crate::inspect::{self, Ctx};
use crate::lines::{LineSplitter, strip_boms};
use crate::sse::SseEvent;
use crate::verdict::Verdict;

/// One dispatched event, with what each of its data lines said.
#[derive(Debug, Default, Clone)]
pub struct Event {
    /// The `event:` field, when one was given.
    pub event: Option<String>,
    /// One entry per `data:` line, in order: its chunk, or `None` when the line is not one JSON
    /// value.
    pub chunks: Vec<Option<Chunk>>,
    /// The values of the event's `error:` field lines, in order (lossily decoded). Standard SSE
    /// ignores a field of that name; some llama.cpp builds report a mid-stream failure that way
    /// (`error: {"code":500,...}`), so the provider's stream reader reads them (docs/boundary.md,
    /// "Provider path and route"). The verdict never looks at them: it follows the BND rules.
    pub error_fields: Vec<String>,
    /// The data lines' bytes, back to back; `ends[i]` is where line `i` ends.
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Event {
    /// Data line `i` as text (lossily decoded when not UTF-8), as [`SseEvent::data_lines`] has it.
    pub fn line(&self, i: usize) -> Cow<'_, str> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        String::from_utf8_lossy(&self.bytes[start..self.ends[i]])
    }

    /// The same event as [`SseDecoder`](crate::SseDecoder) gives, for readers that need the
    /// text (a multi-line event, a line that is not JSON).
    pub fn to_sse(&self) -> SseEvent {
        let data_lines: Vec<String> = (0..self.chunks.len())
            .map(|i| self.line(i).into_owned())
            .collect();
        SseEvent {
            event: self.event.clone(),
            data: data_lines.join("\n"),
            data_lines,
        }
    }

    /// Whether the event has anything to dispatch: a data line or an `error:` field.
    fn has_content(&self) -> bool {
        !self.chunks.is_empty() || !self.error_fields.is_empty()
    }

    fn clear(&mut self) {
        self.event = None;
        self.chunks.clear();
        self.error_fields.clear();
        self.bytes.clear();
        self.ends.clear();
    }
}

/// Reads one body incrementally: [`feed`](Self::feed) each read, then
/// [`finish`](Self::finish). Built by [`EventReader::new`] it only decodes; built by
/// [`EventReader::judged`] it also judges the body as the boundary does.
#[derive(Debug, Default)]
pub struct EventReader {
    lines: LineSplitter,
    judge: Option<State>,
    event: Event,
}

impl EventReader {
    /// Decodes events without judging.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes events and judges the body under `config`.
    pub fn judged(config: &BoundaryConfig) -> Self {
        EventReader {
            judge: Some(State::new(config)),
            ..Self::default()
        }
    }

    /// Feeds one read; `on_event` receives every event this read completes.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(&Event)) {
        let (judge, event) = (&mut self.judge, &mut self.event);
        self.lines.feed_at(chunk, |line, at| {
            Self::line(judge, event, line, at, &mut on_event)
        });
        if let Some(j) = &mut self.judge {
            j.pending(&self.lines);
        }
    }

    /// Ends the body: dispatches a final event that no blank line closed, and gives the verdict
    /// when the reader judges.
    pub fn finish(mut self, mut on_event: impl FnMut(&Event)) -> Option<Verdict> {
        let (judge, event) = (&mut self.judge, &mut self.event);
        self.lines
            .finish_at(|line, at| Self::line(judge, event, line, at, &mut on_event));
        if self.event.has_content() {
            on_event(&self.event);
        }
        let consumed = self.lines.consumed();
        self.judge.map(|j| j.verdict(consumed))
    }

    fn line(
        judge: &mut Option<State>,
        event: &mut Event,
        line: &[u8],
        at: u64,
        on_event: &mut impl FnMut(&Event),
    ) {
        let mut read = LineRead::default();
        if let Some(j) = judge.as_mut().filter(|j| !j.refused()) {
            j.line(line, at, Some(&mut read));
        }
        // The SSE rules, as in `SseDecoder`.
        let line = strip_boms(line);
        if line.is_empty() {
            if event.has_content() {
                on_event(event);
            }
            event.clear();
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                let parsed = match read.parsed {
                    Some(p) => p,
                    None if value == b"[DONE]" => false,
                    None => {
                        let mut ctx = Ctx {
                            judge: None,
                            chunk: Some(&mut read.chunk),
                            facts: Default::default(),
                            credential: None,
                        };
                        inspect::inspect(value, &mut ctx).is_ok()
                    }
                };
                event.chunks.push(parsed.then_some(read.chunk));
                event.bytes.extend_from_slice(value);
                event.ends.push(event.bytes.len());
            }
            b"event" => event.event = Some(String::from_utf8_lossy(value).into_owned()),
            b"error" => event
                .error_fields
                .push(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SseDecoder;
    use docsfab_record::Api;

    fn both(body: &[u8], cut: usize) -> (Vec<SseEvent>, Vec<SseEvent>, Option<Verdict>) {
        let mut d = SseDecoder::new();
        let mut want = Vec::new();
        d.feed(&body[..cut], |e| want.push(e));
        d.feed(&body[cut..], |e| want.push(e));
        d.finish(|e| want.push(e));
        let config = BoundaryConfig::new(Api::OpenaiChat, "m", &[]).unwrap();
        let mut r = EventReader::judged(&config);
        let mut got = Vec::new();
        r.feed(&body[..cut], |e| got.push(e.to_sse()));
        r.feed(&body[cut..], |e| got.push(e.to_sse()));
        let verdict = r.finish(|e| got.push(e.to_sse()));
        assert_eq!(verdict.as_ref(), Some(&config.check(body)));
        (want, got, verdict)
    }

    #[test]
    fn events_and_verdict_match_the_decoder_and_the_boundary_bnd_9() {
        let body = b"event: x\r\ndata: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n: c\n\ndata: x\ndata: \xff\n\nevent: y\n\ndata: [DONE]";
        for cut in 0..=body.len() {
            let (want, got, _) = both(body, cut);
            assert_eq!(got, want, "cut at {cut}");
        }
    }

    // BND-9: an `error:` field line is delivered with its event wherever the body is split,
    // and the verdict stays the boundary's own (it never reads the field).
    #[test]
    fn error_field_lines_reach_the_reader_at_every_split_bnd_9() {
        let body = b"error: {\"code\":500,\"type\":\"server_error\"}\r\n\r\ndata: [DONE]";
        let config = BoundaryConfig::new(Api::OpenaiChat, "m", &[]).unwrap();
        for cut in 0..=body.len() {
            let mut r = EventReader::judged(&config);
            let mut errors = Vec::new();
            r.feed(&body[..cut], |e| errors.extend(e.error_fields.clone()));
            r.feed(&body[cut..], |e| errors.extend(e.error_fields.clone()));
            let verdict = r.finish(|e| errors.extend(e.error_fields.clone()));
            assert_eq!(
                errors,
                ["{\"code\":500,\"type\":\"server_error\"}"],
                "cut {cut}"
            );
            assert_eq!(verdict, Some(config.check(body)), "cut {cut}");
        }
    }

    #[test]
    fn a_data_line_yields_its_chunk_in_the_judging_pass() {
        let config = BoundaryConfig::new(Api::OpenaiChat, "m", &[]).unwrap();
        let mut r = EventReader::judged(&config);
        let mut chunks = Vec::new();
        r.feed(
            b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n",
            |e| chunks.extend(e.chunks.iter().cloned()),
        );
        assert!(r.finish(|_| {}).is_some());
        let c = chunks[0].as_ref().unwrap();
        assert_eq!(c.model.as_deref(), Some("m"));
        let choice = &c.choices.as_ref().unwrap()[0];
        assert_eq!(choice.content.as_deref(), Some("hi"));
        assert_eq!(choice.finish_reason.as_deref(), Some("stop"));
    }
}
