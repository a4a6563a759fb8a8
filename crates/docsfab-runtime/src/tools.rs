//! The tools a step offers the model, and the validation of their calls.

use serde::{Deserialize, Serialize};

/// The tools docsfab knows. `write_file` is the only one that changes the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolName {
    ListFiles,
    ReadFile,
    SearchText,
    WriteFile,
}

impl ToolName {
    pub const ALL: [ToolName; 4] = [
        ToolName::ListFiles,
        ToolName::ReadFile,
        ToolName::SearchText,
        ToolName::WriteFile,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolName::ListFiles => "list_files",
            ToolName::ReadFile => "read_file",
            ToolName::SearchText => "search_text",
            ToolName::WriteFile => "write_file",
        }
    }

    pub fn parse(name: &str) -> Option<ToolName> {
        ToolName::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether the tool can change the filesystem.
    pub fn writes(self) -> bool {
        self == ToolName::WriteFile
    }
}
