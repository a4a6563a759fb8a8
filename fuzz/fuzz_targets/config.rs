//! Any text as host.yaml, a composition or the rules table (the first byte picks which): the
//! parsers must not panic, must stay within their YAML budget, and every refusal must be one
//! line in our own words without a value that looks like a key (issue 9, finding 9).
#![no_main]

use std::collections::BTreeMap;

use docsfab_policy::catalog::resolve;
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;
use docsfab_runtime::composition::Composition;
use libfuzzer_sys::fuzz_target;

/// Words of the YAML library or of Rust that an operator must never see.
const INTERNALS: &[&str] = &[
    "serde",
    "u64",
    "u32",
    "usize",
    "Option<",
    "from_str",
    "Depth {",
    "budget breached",
    "DuplicateKeyPolicy",
    "externally tagged",
    "deserialize",
    "invalid type",
];

/// The refusal standard: one line, at most 300 characters (the path here is short), no
/// internals, and never the planted secret. A word the input itself contains may come back
/// as part of an echoed key or value, so only words absent from `input` count as internals.
fn check_message(message: &str, input: &str) {
    assert!(!message.contains('\n'), "not one line: {message}");
    assert!(message.chars().count() <= 300, "too long: {message}");
    for w in INTERNALS.iter().filter(|w| !input.contains(*w)) {
        assert!(!message.contains(w), "{w:?} in: {message}");
    }
    assert!(
        !message.contains("Zq9Xw8Vu7Ts6Rq5Po4Nm3Lk"),
        "secret echoed: {message}"
    );
}

fuzz_target!(|input: &[u8]| {
    let Some((&which, rest)) = input.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => match HostConfig::parse(text, "h.yaml") {
            Ok(host) => {
                // The resolver reads host values like environment values; plant a key-shaped
                // value in the environment so its message is checked too.
                let mut env = BTreeMap::new();
                if which & 0x80 != 0 {
                    env.insert(
                        "DOCSFAB_READ_ONLY_MAX_RETRIES".to_string(),
                        "sk-Zq9Xw8Vu7Ts6Rq5Po4Nm3Lk".to_string(),
                    );
                }
                if let Err(e) = resolve(&host, &env) {
                    check_message(&e.to_string(), text);
                }
            }
            Err(e) => check_message(&e.to_string(), text),
        },
        1 => {
            if let Err(e) = Composition::parse(text, "c.yaml") {
                check_message(&e.to_string(), text);
            }
        }
        _ => {
            if let Err(e) = RulesTable::parse(text, "r.yaml") {
                check_message(&e.to_string(), text);
            }
        }
    }
});
