//! Server-sent events on top of [`LineSplitter`]: fields are gathered into events, and an event is
//! dispatched at a blank line, or at the end of the stream when no blank line closed it (some
//! consumers dispatch such an unterminated final event, so we do too).

use crate::lines::{LineSplitter, strip_boms};

/// One dispatched event. `data` is the `data:` lines joined with `\n`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when one was given.
    pub event: Option<String>,
    /// The joined `data:` lines, exactly as sent (lossily decoded when not UTF-8).
    pub data: String,
    /// Each `data:` line on its own, in order (the boundary parses every one separately, BND-7).
    pub data_lines: Vec<String>,
}

/// Incremental SSE decoder. Feed reads; collect events.
#[derive(Debug, Default, Clone)]
pub struct SseDecoder {
    lines: LineSplitter,
    current: Option<SseEvent>,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one read; `on_event` receives every event this read completes.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(SseEvent)) {
        let current = &mut self.current;
        self.lines.feed(chunk, |line| {
            if let Some(ev) = Self::line(current, line) {
                on_event(ev);
            }
        });
    }

    /// Ends the stream, dispatching a final event that no blank line closed.
    pub fn finish(&mut self, mut on_event: impl FnMut(SseEvent)) {
        let current = &mut self.current;
        self.lines.finish(|line| {
            if let Some(ev) = Self::line(current, line) {
                on_event(ev);
            }
        });
        if let Some(ev) = self.current.take().filter(|ev| !ev.data_lines.is_empty()) {
            on_event(ev);
        }
    }

    fn line(current: &mut Option<SseEvent>, line: &[u8]) -> Option<SseEvent> {
        let line = strip_boms(line);
        if line.is_empty() {
            // As in the SSE specification, an event with no data line is never dispatched.
            return current.take().filter(|ev| !ev.data_lines.is_empty());
        }
        if line[0] == b':' {
            return None; // comment
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                let ev = current.get_or_insert_with(SseEvent::default);
                if !ev.data_lines.is_empty() {
                    ev.data.push('\n');
                }
                ev.data.push_str(&value);
                ev.data_lines.push(value.into_owned());
            }
            b"event" => {
                current.get_or_insert_with(SseEvent::default).event = Some(value.into_owned())
            }
            _ => {} // id, retry and unknown fields do not matter to a one-shot consumer
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(reads: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for r in reads {
            d.feed(r, |e| out.push(e));
        }
        d.finish(|e| out.push(e));
        out
    }

    #[test]
    fn events_and_multi_line_data() {
        let evs = decode(&[
            b"event: message_start\r\ndata: {\"a\":1}\r\n\r\n: keepalive\n\ndata: x\ndata: y\n\n",
        ]);
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0].event.as_deref(), Some("message_start"));
        assert_eq!(evs[0].data, "{\"a\":1}");
        assert_eq!(evs[1].data, "x\ny");
        assert_eq!(evs[1].data_lines, vec!["x".to_string(), "y".to_string()]);
    }

    #[test]
    fn unterminated_final_event_is_dispatched_bnd_9() {
        let evs = decode(&[b"data: {}\n\ndata: [DONE]"]);
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[1].data, "[DONE]");
    }

    #[test]
    fn events_without_data_are_not_dispatched_bnd_8() {
        let evs = decode(&[b"event: ping\n\nid: 3\n\nevent: message_stop\ndata: {}\n\nevent: x"]);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].event.as_deref(), Some("message_stop"));
    }

    #[test]
    fn bom_lines_are_read_bnd_6() {
        let evs = decode(&[b"\xEF\xBB\xBFdata: 1\n\n\xEF\xBB\xBF\xEF\xBB\xBFdata: 2\n\n"]);
        assert_eq!(
            evs.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
            vec!["1", "2"]
        );
    }
}
