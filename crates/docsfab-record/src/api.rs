//! The wire protocol a provider speaks: one `Api` for the host config, the provider client, the
//! response boundary and the simulator.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// OpenAI-compatible Chat Completions (`POST {baseUrl}/chat/completions`).
    OpenaiChat,
    /// Anthropic Messages (`POST {baseUrl}/messages`).
    AnthropicMessages,
}

impl Api {
    /// The spelling used in `host.yaml` and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenaiChat => "openai-chat",
            Api::AnthropicMessages => "anthropic-messages",
        }
    }

    /// Reads the `host.yaml` / command-line spelling.
    pub fn parse(text: &str) -> Option<Api> {
        match text {
            "openai-chat" => Some(Api::OpenaiChat),
            "anthropic-messages" => Some(Api::AnthropicMessages),
            _ => None,
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
