//! An in-memory [`Transport`] that plays a script, for paused-clock tests of the replay driver
//! here and of the step retry in the runtime. Each request takes the next step of the script,
//! waits the step's delay on the tokio clock, and returns its result. Every request is logged
//! with the time it was sent and the digest of its bytes.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use docsfab_policy::class::ProviderFailure;
use docsfab_record::{FaultKind, ProviderErrorClass, Usage};
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::outcome::{FinishReason, StreamOutcome, TransportFailure, failure};
use crate::request::PayloadDigest;
use crate::transport::Transport;

/// One scripted response.
#[derive(Debug, Clone)]
pub struct ScriptStep {
    /// How long the request takes before its result arrives.
    pub delay: Duration,
    pub result: Result<StreamOutcome, TransportFailure>,
}

impl ScriptStep {
    /// An immediate answer with this text.
    pub fn answer(text: &str) -> Self {
        ScriptStep {
            delay: Duration::ZERO,
            result: Ok(answer(text)),
        }
    }

    /// An immediate failure.
    pub fn fail(f: ProviderFailure) -> Self {
        ScriptStep {
            delay: Duration::ZERO,
            result: Err(TransportFailure::new(f, format!("scripted {:?}", f.fault))),
        }
    }

    /// The same step, taking `delay` before its result.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A completed stream with this text.
pub fn answer(text: &str) -> StreamOutcome {
    StreamOutcome {
        http_status: 200,
        text: text.to_owned(),
        content_published: !text.is_empty(),
        finish_reason: Some(FinishReason::Stop),
        done: true,
        usage: Usage {
            input_tokens: Some(10),
            output_tokens: Some(5),
            ..Usage::ZERO
        },
        tool_calls: Vec::new(),
        models: vec!["scripted-model".to_owned()],
        raw_body: None,
        verdict: None,
        rate_headers: Default::default(),
        gateway: None,
    }
}

/// A response head with this status, classed as the transport would (without a body).
pub fn status(code: u16, class: ProviderErrorClass) -> ProviderFailure {
    ProviderFailure {
        http_status: Some(code),
        ..failure(FaultKind::HttpStatus, class)
    }
}

/// One request the scripted transport received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentRequest {
    pub at: Instant,
    pub digest: PayloadDigest,
}

/// The scripted transport. When the script runs out, requests fail as `unknown`.
#[derive(Debug, Default)]
pub struct ScriptedTransport {
    steps: Mutex<VecDeque<ScriptStep>>,
    sent: Mutex<Vec<SentRequest>>,
}

impl ScriptedTransport {
    pub fn new(steps: impl IntoIterator<Item = ScriptStep>) -> Self {
        ScriptedTransport {
            steps: Mutex::new(steps.into_iter().collect()),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Every request received so far, in order.
    pub fn sent(&self) -> Vec<SentRequest> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Transport for ScriptedTransport {
    fn send(&self, body: Bytes) -> BoxFuture<'_, Result<StreamOutcome, TransportFailure>> {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(SentRequest {
                at: Instant::now(),
                digest: PayloadDigest::of(&body),
            });
        let step = self
            .steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        Box::pin(async move {
            let Some(step) = step else {
                return Err(TransportFailure::new(
                    failure(FaultKind::ErrorEvent, ProviderErrorClass::Unknown),
                    "the script has no more steps",
                ));
            };
            if !step.delay.is_zero() {
                tokio::time::sleep(step.delay).await;
            }
            step.result
        })
    }
}
