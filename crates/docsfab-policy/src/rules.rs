//! The host-owned retry rules table (STP-8).
//!
//! Every step retry decision names the rule that made it (`retryRule` in the run record). The
//! table is YAML: the shipped default is `crates/docsfab-policy/retry-policy.yaml`, embedded in the
//! binary; an operator may place a copy at `DOCSFAB_HOME/retry-policy.yaml`, which the CLI reads
//! and hands to [`RulesTable::parse`]. Reading that file is I/O and stays out of this crate.
//!
//! The table is free to choose rule ids, feedback, and how a request refused before sending is
//! treated by its error text. It is not free to contradict the class policy: a table whose class
//! rules would retry `content-filter`, `authentication`, `invalid-request` or a rate limit
//! without HTTP 429 (a quota), or would stop retrying a transient class, is refused when parsed.

use docsfab_record::ProviderErrorClass;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::class::ProviderFailure;
use crate::host::{from_yaml, yaml_error_parts};

/// The shipped table, as text.
pub const EMBEDDED_SOURCE: &str = include_str!("../retry-policy.yaml");
/// The name the embedded table reports in errors and doctor shows for the embedded table: the path the retry spec and the docs use. In the
/// source tree it is a symbolic link to the crate's own copy, which is what `include_str!` reads,
/// so the crate builds from its own directory.
pub const EMBEDDED_NAME: &str = "config/model-output/retry-policy.yaml";
/// The file name of the operator copy inside `DOCSFAB_HOME`.
pub const OPERATOR_FILE_NAME: &str = "retry-policy.yaml";

/// What a rule does with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleAction {
    /// Retry from the transport budget (the attempt delivered nothing to judge).
    Transport,
    /// Retry from the contract-correction budget (`retry.maxRetries`).
    Contract,
    /// End the step; never retried.
    Terminal,
}

/// A condition of an attempt that the step layer judged, or that ended it outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// The reply was prose where a JSON object was required.
    ContractProse,
    /// The reply was a JSON array where an object was required.
    ContractArray,
    /// The reply was empty.
    ContractEmpty,
    /// The reply was a JSON object that failed the contract's schema.
    ContractSchemaInvalid,
    /// The reply met the schema but cited names the workspace does not hold.
    ContractUngrounded,
    /// The answer was cut at the output limit (STP-10).
    CutAnswer,
    /// The host's own attempt timer fired (STP-11).
    AttemptDeadline,
    /// The runtime stopped the attempt as no-progress (STP-12).
    NoProgress,
    /// A validator refused the answer and marked the refusal terminal (STP-14).
    ValidatorTerminal,
    /// The model's context was exhausted (STP-14).
    ContextExhausted,
    /// The caller cancelled the attempt.
    Cancelled,
}

impl Condition {
    /// Every condition, in declaration order; the table has one rule per condition.
    pub const ALL: [Condition; 11] = [
        Condition::ContractProse,
        Condition::ContractArray,
        Condition::ContractEmpty,
        Condition::ContractSchemaInvalid,
        Condition::ContractUngrounded,
        Condition::CutAnswer,
        Condition::AttemptDeadline,
        Condition::NoProgress,
        Condition::ValidatorTerminal,
        Condition::ContextExhausted,
        Condition::Cancelled,
    ];

    /// The kebab-case name used in the table and in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::ContractProse => "contract-prose",
            Condition::ContractArray => "contract-array",
            Condition::ContractEmpty => "contract-empty",
            Condition::ContractSchemaInvalid => "contract-schema-invalid",
            Condition::ContractUngrounded => "contract-ungrounded",
            Condition::CutAnswer => "cut-answer",
            Condition::AttemptDeadline => "attempt-deadline",
            Condition::NoProgress => "no-progress",
            Condition::ValidatorTerminal => "validator-terminal",
            Condition::ContextExhausted => "context-exhausted",
            Condition::Cancelled => "cancelled",
        }
    }

    /// Conditions no table may retry.
    fn always_terminal(self) -> bool {
        matches!(
            self,
            Condition::ValidatorTerminal | Condition::ContextExhausted | Condition::Cancelled
        )
    }
}

/// The correction a retry carries to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feedback {
    /// Return only the JSON object the contract asks for (STP-9).
    ReturnOnlyTheJsonObject,
    /// Return the object again, meeting the contract's schema.
    MeetTheContractSchema,
    /// Cite only names the workspace holds (the attempt's unknown names go with it).
    GroundEveryName,
    /// Answer completely and well inside the output limit (STP-10).
    AnswerCompletelyInsideLimit,
    /// Read only what the answer needs (STP-11, after the host deadline).
    ReadOnlyWhatIsNeeded,
    /// Answer at the first notice-only re-read (STP-12).
    AnswerAtFirstNotice,
}

/// A rule for a failure whose request left the host: decided by its provider error class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassRule {
    /// The rule's id, recorded as the attempt's `retryRule`.
    pub id: String,
    /// The provider error class the rule decides.
    pub class: ProviderErrorClass,
    /// When present, the rule matches only failures with this HTTP status on the response head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// What the rule decides.
    pub action: RuleAction,
}

/// A rule for a condition the step layer judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConditionRule {
    /// The rule's id, recorded as the attempt's `retryRule`.
    pub id: String,
    /// The condition the rule decides.
    pub condition: Condition,
    /// What the rule decides.
    pub action: RuleAction,
    /// The correction a contract retry under this rule carries to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<Feedback>,
}

/// A rule for a request the host refused before sending: decided by its error text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TextRule {
    /// The rule's id, recorded as the attempt's `retryRule`.
    pub id: String,
    /// Case-insensitive fragments; the rule matches when the text contains any of them.
    pub contains: Vec<String>,
    /// What the rule decides.
    pub action: RuleAction,
}

/// The rule for refused-before-send text that no text rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultRule {
    /// The rule's id, recorded as the attempt's `retryRule`.
    pub id: String,
    /// What the rule decides.
    pub action: RuleAction,
}

/// Rule ids for the write-step outcomes (STP-1, WRT-1, WRT-2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteRules {
    /// A write step's failure that is not a transport failure: the step stays single-attempt.
    pub single_attempt: String,
    /// A transport failure whose write settlement could not be proven or undone.
    pub declined: String,
}

/// The file as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTable {
    version: u32,
    class_rules: Vec<ClassRule>,
    condition_rules: Vec<ConditionRule>,
    #[serde(default)]
    text_rules: Vec<TextRule>,
    default_rule: DefaultRule,
    write_rules: WriteRules,
}

/// A validated rules table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesTable {
    class_rules: Vec<ClassRule>,
    /// One rule per condition, in the order of [`Condition::ALL`].
    condition_rules: [ConditionRule; Condition::ALL.len()],
    text_rules: Vec<TextRule>,
    /// `text_rules[i].contains`, lowercased once.
    text_needles: Vec<Vec<String>>,
    default_rule: DefaultRule,
    write_rules: WriteRules,
}

/// Why a rules table was refused. Each message names the source.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RulesError {
    #[error("{source_name} line {line}, column {column}: {message}")]
    Syntax {
        source_name: String,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
}

impl RulesError {
    fn invalid(source: &str, message: impl Into<String>) -> Self {
        RulesError::Invalid {
            source_name: source.to_string(),
            message: message.into(),
        }
    }
}

/// The only table format this build reads.
pub const TABLE_VERSION: u32 = 1;

impl RulesTable {
    /// The table shipped in `crates/docsfab-policy/retry-policy.yaml`.
    ///
    /// # Errors
    /// Only if the shipped file is broken, which the crate's tests rule out.
    pub fn embedded() -> Result<RulesTable, RulesError> {
        RulesTable::parse(EMBEDDED_SOURCE, EMBEDDED_NAME)
    }

    /// Parses and validates a table. `source` names the file in every error message.
    ///
    /// # Errors
    /// A YAML or shape error (with line and column), or a table that breaks an invariant.
    pub fn parse(text: &str, source: &str) -> Result<RulesTable, RulesError> {
        let raw: RawTable = from_yaml(text).map_err(|e| syntax_error(&e, source, text))?;
        validate(raw, source)
    }

    /// The class rule that decides a failure whose request left the host (STP-3).
    /// Validation guarantees one matches every failure; the fallback is never reached.
    pub fn class_rule(&self, failure: &ProviderFailure) -> ClassRuleRef<'_> {
        match find_class_rule(&self.class_rules, failure.class, failure.http_status) {
            Some(rule) => ClassRuleRef {
                id: &rule.id,
                action: rule.action,
            },
            None => ClassRuleRef {
                id: &self.default_rule.id,
                action: RuleAction::Terminal,
            },
        }
    }

    /// The rule for a judged condition.
    pub fn condition_rule(&self, condition: Condition) -> &ConditionRule {
        // The array holds one rule per condition in declaration order.
        &self.condition_rules[condition as usize]
    }

    /// The rule for a request refused before sending, from its error text (STP-4): the first
    /// text rule with a matching fragment, else the default rule.
    pub fn text_rule(&self, error_text: &str) -> (&str, RuleAction) {
        let text = error_text.to_lowercase();
        self.text_rules
            .iter()
            .zip(&self.text_needles)
            .find(|(_, needles)| needles.iter().any(|n| text.contains(n.as_str())))
            .map(|(rule, _)| (rule.id.as_str(), rule.action))
            .unwrap_or((self.default_rule.id.as_str(), self.default_rule.action))
    }

    /// The write-step rule ids.
    pub fn write_rules(&self) -> &WriteRules {
        &self.write_rules
    }

    /// The default rule.
    pub fn default_rule(&self) -> &DefaultRule {
        &self.default_rule
    }

    /// Every class rule, in matching order.
    pub fn class_rules(&self) -> &[ClassRule] {
        &self.class_rules
    }

    /// Every condition rule.
    pub fn condition_rules(&self) -> &[ConditionRule] {
        &self.condition_rules
    }

    /// Every text rule, in matching order.
    pub fn text_rules(&self) -> &[TextRule] {
        &self.text_rules
    }
}

/// The class rule chosen for a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassRuleRef<'a> {
    /// The rule's id, recorded as the attempt's `retryRule`.
    pub id: &'a str,
    /// What the rule decides.
    pub action: RuleAction,
}

fn find_class_rule(
    rules: &[ClassRule],
    class: ProviderErrorClass,
    http_status: Option<u16>,
) -> Option<&ClassRule> {
    rules
        .iter()
        .find(|r| r.class == class && r.http_status.is_none_or(|s| Some(s) == http_status))
}

fn syntax_error(e: &serde_saphyr::Error, source: &str, text: &str) -> RulesError {
    let (line, column, message) = yaml_error_parts(e, text);
    RulesError::Syntax {
        source_name: source.to_string(),
        line,
        column,
        message,
    }
}

fn validate(raw: RawTable, source: &str) -> Result<RulesTable, RulesError> {
    if raw.version != TABLE_VERSION {
        return Err(RulesError::invalid(
            source,
            format!(
                "version {} is not supported; this docsfab reads version {TABLE_VERSION}",
                raw.version
            ),
        ));
    }
    check_unique_ids(&raw, source)?;
    check_class_rules(&raw.class_rules, source)?;
    let condition_rules = check_condition_rules(&raw.condition_rules, source)?;
    let text_needles = check_text_rules(&raw.text_rules, source)?;
    Ok(RulesTable {
        class_rules: raw.class_rules,
        condition_rules,
        text_rules: raw.text_rules,
        text_needles,
        default_rule: raw.default_rule,
        write_rules: raw.write_rules,
    })
}

/// Every rule has a non-empty id of its own.
fn check_unique_ids(raw: &RawTable, source: &str) -> Result<(), RulesError> {
    let mut ids: Vec<&str> = Vec::new();
    let all_ids = raw
        .class_rules
        .iter()
        .map(|r| r.id.as_str())
        .chain(raw.condition_rules.iter().map(|r| r.id.as_str()))
        .chain(raw.text_rules.iter().map(|r| r.id.as_str()))
        .chain([
            raw.default_rule.id.as_str(),
            raw.write_rules.single_attempt.as_str(),
            raw.write_rules.declined.as_str(),
        ]);
    for id in all_ids {
        if id.trim().is_empty() {
            return Err(RulesError::invalid(source, "a rule has an empty id"));
        }
        if ids.contains(&id) {
            return Err(RulesError::invalid(
                source,
                format!("rule id `{id}` is used twice; every rule needs its own id"),
            ));
        }
        ids.push(id);
    }
    Ok(())
}

/// Every class, without a status, with HTTP 429 and with every status a rule names for it,
/// must meet a rule that agrees with the class policy.
fn check_class_rules(rules: &[ClassRule], source: &str) -> Result<(), RulesError> {
    for class in ProviderErrorClass::ALL {
        let named = rules
            .iter()
            .filter(|r| r.class == class)
            .filter_map(|r| r.http_status);
        let mut statuses = vec![None, Some(429)];
        for status in named.map(Some) {
            if !statuses.contains(&status) {
                statuses.push(status);
            }
        }
        for status in statuses {
            check_class_status(rules, class, status, source)?;
        }
    }
    Ok(())
}

/// The rule that `class` with `status` meets exists and agrees with the class policy.
fn check_class_status(
    rules: &[ClassRule],
    class: ProviderErrorClass,
    status: Option<u16>,
    source: &str,
) -> Result<(), RulesError> {
    let Some(rule) = find_class_rule(rules, class, status) else {
        return Err(RulesError::invalid(
            source,
            format!("no class rule matches class `{class}`; add one without httpStatus"),
        ));
    };
    let probe = ProviderFailure {
        class,
        http_status: status,
        ..ProviderFailure::from_http_status(status.unwrap_or(0), None)
    };
    let required = if probe.is_transport_retryable() {
        Some(RuleAction::Transport)
    } else if class == ProviderErrorClass::Unknown {
        None
    } else {
        Some(RuleAction::Terminal)
    };
    let allowed = match required {
        Some(action) => rule.action == action,
        None => rule.action != RuleAction::Contract,
    };
    if allowed {
        return Ok(());
    }
    let seen = match status {
        Some(s) => format!("class `{class}` with HTTP {s}"),
        None => format!("class `{class}` without HTTP status"),
    };
    let must = match required {
        Some(RuleAction::Transport) => "must be `transport`: it is always retryable",
        Some(_) => "must be `terminal`: it is never retried",
        None => "must be `transport` or `terminal`",
    };
    Err(RulesError::invalid(
        source,
        format!("rule `{}` for {seen} {must}", rule.id),
    ))
}

/// Exactly one rule per condition, each with an action the condition allows; returned in the
/// order of [`Condition::ALL`].
fn check_condition_rules(
    rules: &[ConditionRule],
    source: &str,
) -> Result<[ConditionRule; Condition::ALL.len()], RulesError> {
    let mut by_condition = Vec::with_capacity(Condition::ALL.len());
    for condition in Condition::ALL {
        let mut matching = rules.iter().filter(|r| r.condition == condition);
        let Some(rule) = matching.next() else {
            return Err(RulesError::invalid(
                source,
                format!("no condition rule for `{}`", condition.as_str()),
            ));
        };
        if matching.next().is_some() {
            return Err(RulesError::invalid(
                source,
                format!("condition `{}` has more than one rule", condition.as_str()),
            ));
        }
        check_condition_action(rule, condition, source)?;
        by_condition.push(rule.clone());
    }
    by_condition
        .try_into()
        .map_err(|_| RulesError::invalid(source, "condition rules are incomplete"))
}

/// The action of the one rule for `condition` is one that condition allows.
fn check_condition_action(
    rule: &ConditionRule,
    condition: Condition,
    source: &str,
) -> Result<(), RulesError> {
    if condition.always_terminal() && rule.action != RuleAction::Terminal {
        return Err(RulesError::invalid(
            source,
            format!(
                "rule `{}` for `{}` must be `terminal`: it is never retried",
                rule.id,
                condition.as_str()
            ),
        ));
    }
    // A judged attempt delivered an answer, so its retry is a correction, never transport.
    if rule.action == RuleAction::Transport {
        return Err(RulesError::invalid(
            source,
            format!(
                "rule `{}` for `{}` must be `contract` or `terminal`",
                rule.id,
                condition.as_str()
            ),
        ));
    }
    if rule.feedback.is_some() && rule.action != RuleAction::Contract {
        return Err(RulesError::invalid(
            source,
            format!("rule `{}` gives feedback but does not retry", rule.id),
        ));
    }
    Ok(())
}

/// Every text rule has non-empty fragments; returns them lowercased, one list per rule.
fn check_text_rules(rules: &[TextRule], source: &str) -> Result<Vec<Vec<String>>, RulesError> {
    let mut text_needles = Vec::with_capacity(rules.len());
    for rule in rules {
        if rule.contains.is_empty() || rule.contains.iter().any(|n| n.trim().is_empty()) {
            return Err(RulesError::invalid(
                source,
                format!(
                    "text rule `{}` needs non-empty `contains` fragments",
                    rule.id
                ),
            ));
        }
        text_needles.push(rule.contains.iter().map(|n| n.to_lowercase()).collect());
    }
    Ok(text_needles)
}
