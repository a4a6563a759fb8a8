//! The run's shared provider throttle (`DOCSFAB_HOME/throttle.db`), from host.yaml's
//! per-provider `throttle` and `maxConcurrentRequests`. See docs/throttle.md.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use docsfab_policy::host::{HostConfig, ProviderThrottle, ThrottleMode};
use docsfab_throttle::{Mode, Settings, Throttle};

/// The file the throttle shares its state in, beside the run store.
pub const THROTTLE_FILE_NAME: &str = "throttle.db";

/// The one conversion from host.yaml's throttle settings to the throttle's own. host.yaml's
/// parser already keeps `maxConcurrentRequests` within 1..=64, the throttle's range too; a
/// value outside it (impossible from a parsed file) falls back to the defaults.
pub fn settings(t: &ProviderThrottle) -> Settings {
    let mode = match t.mode {
        ThrottleMode::Shared => Mode::Shared,
        ThrottleMode::Off => Mode::Off,
    };
    Settings::new(mode, u32::from(t.max_concurrent_requests)).unwrap_or_default()
}

/// Where the throttle is and how each provider of host.yaml is throttled; nothing opened yet.
#[derive(Debug, Clone)]
pub struct ThrottlePlan {
    pub path: PathBuf,
    pub providers: Vec<(String, Settings)>,
}

impl ThrottlePlan {
    pub fn new(home: &Path, host: &HostConfig) -> ThrottlePlan {
        ThrottlePlan {
            path: home.join(THROTTLE_FILE_NAME),
            providers: host
                .providers
                .iter()
                .map(|(name, p)| (name.clone(), settings(&p.throttle)))
                .collect(),
        }
    }

    /// Opens the shared state. A file that cannot be opened does not stop the work: the
    /// throttle only makes sending polite, so the requests go unthrottled and the operator is
    /// told in one line how to repair it.
    pub fn open(&self) -> Option<Throttle> {
        match Throttle::open(&self.path, self.providers.iter().cloned()) {
            Ok(t) => Some(t),
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: {e}; provider requests go unthrottled. The file holds only soft state: fix the directory's permissions or delete the file."
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_policy::host::ThrottleGiven;

    #[test]
    fn issue12_host_throttle_settings_map_mode_and_cap_one_to_one() {
        let shared = ProviderThrottle {
            max_concurrent_requests: 2,
            mode: ThrottleMode::Shared,
            given: ThrottleGiven::default(),
        };
        assert_eq!(settings(&shared), Settings::new(Mode::Shared, 2).unwrap());
        let off = ProviderThrottle {
            mode: ThrottleMode::Off,
            ..shared
        };
        assert_eq!(settings(&off), Settings::new(Mode::Off, 2).unwrap());
        assert_eq!(settings(&ProviderThrottle::default()), Settings::default());
    }
}
