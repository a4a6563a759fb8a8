//! The host-owned rules table (STP-8).

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::rules::{
    Condition, EMBEDDED_SOURCE, Feedback, RuleAction, RulesError, RulesTable,
};
use docsfab_record::{FaultKind, ProviderErrorClass};

fn table() -> RulesTable {
    RulesTable::embedded().expect("the shipped table is valid")
}

// Proves STP-8.
#[test]
fn shipped_table_parses_and_names_every_rule_stp_8() {
    let t = table();
    let p = |f: ProviderFailure| t.class_rule(&f).id.to_string();
    assert_eq!(
        p(ProviderFailure::from_http_status(429, None)),
        "class-rate-limit-throttled"
    );
    assert_eq!(
        p(ProviderFailure::from_http_status(503, None)),
        "class-server"
    );
    assert_eq!(
        p(ProviderFailure::from_fault(FaultKind::ConnectRefused)),
        "class-network"
    );
    assert_eq!(
        t.condition_rule(Condition::ContractProse).feedback,
        Some(Feedback::ReturnOnlyTheJsonObject)
    );
    assert_eq!(
        t.text_rule("ECONNREFUSED 127.0.0.1:443"),
        ("text-connection-unavailable", RuleAction::Transport)
    );
    assert_eq!(
        t.text_rule("something odd"),
        ("default-terminal", RuleAction::Terminal)
    );
}

// Proves STP-8.
#[test]
fn condition_rules_are_indexed_in_declaration_order_stp_8() {
    let t = table();
    for (i, c) in Condition::ALL.into_iter().enumerate() {
        assert_eq!(c as usize, i);
        assert_eq!(t.condition_rule(c).condition, c);
    }
}

// Proves STP-8.
#[test]
fn malformed_file_names_source_and_line_stp_8() {
    let text = EMBEDDED_SOURCE.replace(
        "  - id: class-server\n",
        "  - id: class-server\n    bogus: 1\n",
    );
    let err =
        RulesTable::parse(&text, "/home/op/.docsfab/retry-policy.yaml").expect_err("unknown field");
    match &err {
        RulesError::Syntax {
            source_name, line, ..
        } => {
            assert_eq!(source_name, "/home/op/.docsfab/retry-policy.yaml");
            let expected = text
                .lines()
                .position(|l| l.contains("bogus"))
                .expect("present") as u64
                + 1;
            assert_eq!(*line, expected);
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(
        shown.starts_with("/home/op/.docsfab/retry-policy.yaml line "),
        "{shown}"
    );

    let err = RulesTable::parse("version: [", "x.yaml").expect_err("bad yaml");
    assert!(err.to_string().starts_with("x.yaml line "), "{err}");
}

fn refused(text: &str) -> String {
    match RulesTable::parse(text, "ops.yaml") {
        Err(RulesError::Invalid {
            source_name,
            message,
        }) => {
            assert_eq!(source_name, "ops.yaml");
            message
        }
        other => panic!("expected an invalid table, got {other:?}"),
    }
}

// Proves STP-3, STP-8.
#[test]
fn table_may_not_retry_terminal_classes_stp_3_stp_8() {
    for id in [
        "class-content-filter",
        "class-authentication",
        "class-invalid-request",
        "class-rate-limit-quota",
    ] {
        let needle = format!("  - id: {id}\n");
        let start = EMBEDDED_SOURCE.find(&needle).expect("rule present");
        let end = start
            + EMBEDDED_SOURCE[start..]
                .find("action: terminal")
                .expect("terminal action");
        let mut text = EMBEDDED_SOURCE.to_string();
        text.replace_range(end..end + "action: terminal".len(), "action: transport");
        let message = refused(&text);
        assert!(
            message.contains(id) && message.contains("must be `terminal`"),
            "{message}"
        );
    }
}

// Proves STP-3, STP-8.
#[test]
fn table_may_not_stop_transient_classes_stp_3_stp_8() {
    let text = EMBEDDED_SOURCE.replacen(
        "  - id: class-network\n    class: network\n    action: transport",
        "  - id: class-network\n    class: network\n    action: terminal",
        1,
    );
    assert_ne!(text, EMBEDDED_SOURCE);
    let message = refused(&text);
    assert!(
        message.contains("class-network") && message.contains("must be `transport`"),
        "{message}"
    );
}

// Proves STP-3, STP-8: a rule for one HTTP status of a transient class is held to the class
// policy too, not only the class's catch-all rule.
#[test]
fn a_status_rule_may_not_stop_or_misroute_a_transient_class_stp_3_stp_8() {
    for (action, must) in [
        ("terminal", "must be `transport`"),
        ("contract", "must be `transport`"),
    ] {
        let text = EMBEDDED_SOURCE.replacen(
            "  - id: class-server\n",
            &format!(
                "  - id: class-server-503\n    class: server\n    httpStatus: 503\n    action: {action}\n  - id: class-server\n"
            ),
            1,
        );
        assert_ne!(text, EMBEDDED_SOURCE);
        let message = refused(&text);
        assert!(
            message.contains("class-server-503") && message.contains(must),
            "{message}"
        );
    }
    // A status rule that agrees with the class policy is accepted and decides its status.
    let text = EMBEDDED_SOURCE.replacen(
        "  - id: class-server\n",
        "  - id: class-server-503\n    class: server\n    httpStatus: 503\n    action: transport\n  - id: class-server\n",
        1,
    );
    let t = RulesTable::parse(&text, "retry-policy.yaml").expect("an agreeing status rule");
    assert_eq!(
        t.class_rule(&ProviderFailure::from_http_status(503, None))
            .id,
        "class-server-503"
    );
}

// Proves STP-8.
#[test]
fn a_429_rule_placed_after_the_catch_all_is_refused_stp_8() {
    // With the quota rule first, HTTP 429 would be terminal: refused.
    let text = EMBEDDED_SOURCE.replacen(
        "  - id: class-rate-limit-throttled\n    class: rate-limit\n    httpStatus: 429\n    action: transport\n  - id: class-rate-limit-quota\n    class: rate-limit\n    action: terminal",
        "  - id: class-rate-limit-quota\n    class: rate-limit\n    action: terminal\n  - id: class-rate-limit-throttled\n    class: rate-limit\n    httpStatus: 429\n    action: transport",
        1,
    );
    assert_ne!(text, EMBEDDED_SOURCE);
    assert!(refused(&text).contains("class-rate-limit-quota"));
}

// Proves STP-14.
#[test]
fn terminal_conditions_stay_terminal_stp_14() {
    let text = EMBEDDED_SOURCE.replacen(
        "    condition: context-exhausted\n    action: terminal",
        "    condition: context-exhausted\n    action: contract",
        1,
    );
    assert_ne!(text, EMBEDDED_SOURCE);
    assert!(refused(&text).contains("terminal-context-exhausted"));
}

// Proves STP-8.
#[test]
fn missing_and_duplicate_rules_are_refused_stp_8() {
    let text = EMBEDDED_SOURCE.replacen(
        "  - id: class-unknown\n    class: unknown\n    action: terminal\n",
        "",
        1,
    );
    assert!(refused(&text).contains("class `unknown`"));
    let text = EMBEDDED_SOURCE.replacen("id: class-server", "id: class-network", 1);
    assert!(refused(&text).contains("used twice"));
    let text = EMBEDDED_SOURCE.replacen("version: 1", "version: 2", 1);
    assert!(refused(&text).contains("version 2"));
}

// Proves STP-8: a YAML error in an operator's table reads like one in host.yaml, one sentence
// with its line and without the YAML library's advice about its own options.
#[test]
fn a_duplicate_key_is_one_sentence_naming_its_line_stp_8() {
    let text = EMBEDDED_SOURCE.replacen("version: 1\n", "version: 1\nversion: 1\n", 1);
    assert_ne!(text, EMBEDDED_SOURCE);
    let err = RulesTable::parse(&text, "retry-policy.yaml").expect_err("duplicate key");
    let expected_line = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("version:"))
        .nth(1)
        .expect("second version line")
        .0 as u64
        + 1;
    match &err {
        RulesError::Syntax { line, message, .. } => {
            assert_eq!(*line, expected_line);
            assert!(message.contains("duplicate"), "{message}");
            assert!(!message.contains("DuplicateKeyPolicy"), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

// Proves STP-4.
#[test]
fn text_rules_match_case_insensitively_in_order_stp_4() {
    let t = table();
    assert_eq!(
        t.text_rule("Connection Reset by peer").0,
        "text-connection-unavailable"
    );
    assert_eq!(
        t.text_rule("payload digest mismatch: connection reset").0,
        "text-payload-digest-mismatch"
    );
}

// Proves STP-3.
#[test]
fn every_class_meets_a_rule_that_agrees_with_the_class_policy_stp_3() {
    let t = table();
    for class in ProviderErrorClass::ALL {
        for status in [None, Some(429), Some(500)] {
            let mut f = ProviderFailure::from_fault(FaultKind::ErrorEvent);
            f.class = class;
            f.http_status = status;
            let rule = t.class_rule(&f);
            let retryable = f.is_transport_retryable();
            assert_eq!(
                rule.action == RuleAction::Transport,
                retryable,
                "{class:?} {status:?}"
            );
        }
    }
}
