//! Which `DOCSFAB_` variables docsfab reads, and a warning for every other one that is set, so a
//! misspelt limit (`DOCSFAB_READ_ONLY_MAX_RETRIE=1`) is noticed instead of silently ignored.
//! Only names are ever shown: a value may be a key.

use docsfab_policy::catalog::Limit;

/// The variables docsfab reads outside the limit catalog: the host directory, the run store,
/// the PostgreSQL heartbeat, the route's four knobs, and the ones the project's own tooling
/// reads (`DOCSFAB_COMPAT_DIR`: compat/install.sh and the SDK tests; `DOCSFAB_BLESS`:
/// golden-file tests; the PostgreSQL, browser and LiteLLM test settings .ci/run exports, and
/// the gateway test's install place and printing switch). The tooling
/// ones are listed so that a developer running the test suite is not warned about them on
/// every command.
const OTHER_KNOWN: [&str; 17] = [
    "DOCSFAB_HOME",
    "DOCSFAB_STORE",
    "DOCSFAB_HEARTBEAT_MS",
    "DOCSFAB_ROUTE_HEADER_TIMEOUT_MS",
    "DOCSFAB_ROUTE_BODY_TIMEOUT_MS",
    "DOCSFAB_ROUTE_MAX_CONNECTIONS",
    "DOCSFAB_ROUTE_SHUTDOWN_GRACE_MS",
    "DOCSFAB_COMPAT_DIR",
    "DOCSFAB_BLESS",
    "DOCSFAB_TEST_POSTGRES",
    "DOCSFAB_REQUIRE_POSTGRES",
    "DOCSFAB_REQUIRE_BROWSER",
    "DOCSFAB_PLAYWRIGHT_DIR",
    "DOCSFAB_CHROMIUM",
    "DOCSFAB_REQUIRE_LITELLM",
    "DOCSFAB_LITELLM_DIR",
    "DOCSFAB_GATEWAY_PRINT",
];

/// Every `DOCSFAB_` variable docsfab itself reads.
pub fn known() -> Vec<&'static str> {
    Limit::ALL
        .into_iter()
        .filter_map(Limit::env_var)
        .chain(OTHER_KNOWN)
        .collect()
}

/// One warning (without the `warning: ` prefix) for each name in `set` that starts with
/// `DOCSFAB_` and is neither known nor in `also_read` (the key variables host.yaml names, which
/// may well start with `DOCSFAB_` too).
pub fn unknown_warnings<'a>(
    set: impl IntoIterator<Item = &'a str>,
    also_read: &[&str],
) -> Vec<String> {
    let known = known();
    set.into_iter()
        .filter(|name| name.starts_with("DOCSFAB_"))
        .filter(|name| !known.contains(name) && !also_read.contains(name))
        .map(|name| {
            // Debug-quoting the name keeps a control character in it from reaching the terminal.
            let shown = format!("{name:?}");
            let shown = shown.trim_matches('"');
            let closest = closest(name, &known);
            format!(
                "{shown} is not a variable docsfab reads, so it has no effect; did you mean {closest}?"
            )
        })
        .collect()
}

/// The known name nearest to `name` by edit distance (the first on a tie, in catalog order).
fn closest<'k>(name: &str, known: &[&'k str]) -> &'k str {
    known
        .iter()
        .copied()
        .min_by_key(|k| edit_distance(name, k))
        .unwrap_or("DOCSFAB_HOME")
}

/// Levenshtein distance over chars, two rows; names are short, so O(n·m) is nothing.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("RETRIE", "RETRIES"), 1);
    }

    #[test]
    fn hardening_unknown_env_names_closest_known() {
        let w = unknown_warnings(
            [
                "DOCSFAB_READ_ONLY_MAX_RETRIE",
                "DOCSFAB_HOME",
                "DOCSFAB_MY_KEY",
                "OTHER",
                "DOCSFAB_ROUTE_MAX_CONNECTION",
            ],
            &["DOCSFAB_MY_KEY"],
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].ends_with("did you mean DOCSFAB_READ_ONLY_MAX_RETRIES?"),
            "{w:?}"
        );
        assert!(
            w[1].ends_with("did you mean DOCSFAB_ROUTE_MAX_CONNECTIONS?"),
            "{w:?}"
        );
    }
}
