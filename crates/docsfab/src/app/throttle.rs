//! The run's shared provider throttle, from host.yaml's per-provider `throttle` and
//! `maxConcurrentRequests`, kept beside the run store: `DOCSFAB_HOME/throttle.db` for the SQLite
//! store, the store's own database for PostgreSQL. See docs/throttle.md.

use std::io::Write as _;
use std::path::Path;

use docsfab_pg::PgUrl;
use docsfab_policy::host::{HostConfig, ProviderThrottle, ThrottleMode};
use docsfab_throttle::{Backend, DEFAULT_POLL, Mode, Settings, Throttle};

/// The file the throttle shares its state in, beside the SQLite run store.
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
    pub backend: Backend,
    pub providers: Vec<(String, Settings)>,
}

impl ThrottlePlan {
    /// The throttle of the SQLite store on `home`: `home/throttle.db`.
    pub fn new(home: &Path, host: &HostConfig) -> ThrottlePlan {
        ThrottlePlan::for_store(home, None, host)
    }

    /// The throttle that goes with the run store `store`: PostgreSQL's tables for a
    /// PostgreSQL store, `home/throttle.db` otherwise.
    pub fn for_store_url(
        home: &Path,
        store: &docsfab_runtime::store::StoreUrl,
        host: &HostConfig,
    ) -> ThrottlePlan {
        match store {
            docsfab_runtime::store::StoreUrl::Postgres(url) => {
                ThrottlePlan::for_store(home, Some(url), host)
            }
            docsfab_runtime::store::StoreUrl::Sqlite(_) => ThrottlePlan::new(home, host),
        }
    }

    /// The throttle that goes with the run store: `home/throttle.db` for the SQLite store
    /// (`postgres` is `None`), the `throttle_*` tables of the store's database for PostgreSQL,
    /// so every worker on that database, on any host, shares one throttle per provider.
    pub fn for_store(home: &Path, postgres: Option<&PgUrl>, host: &HostConfig) -> ThrottlePlan {
        ThrottlePlan {
            backend: match postgres {
                Some(url) => Backend::Postgres(url.clone()),
                None => Backend::Sqlite(home.join(THROTTLE_FILE_NAME)),
            },
            providers: host
                .providers
                .iter()
                .map(|(name, p)| (name.clone(), settings(&p.throttle)))
                .collect(),
        }
    }

    /// Opens the shared state. State that cannot be opened does not stop the work: the
    /// throttle only makes sending polite, so the requests go unthrottled and the operator is
    /// told in one line how to repair it.
    pub fn open(&self) -> Option<Throttle> {
        match Throttle::open_at(&self.backend, self.providers.iter().cloned(), DEFAULT_POLL) {
            Ok(t) => Some(t),
            Err(e) => {
                let repair = match self.backend {
                    Backend::Sqlite(_) => {
                        "The file holds only soft state: fix the directory's permissions or delete the file."
                    }
                    Backend::Postgres(_) => {
                        "Its tables hold only soft state: check that the database is reachable and that this role may create tables in it."
                    }
                };
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: {e}; provider requests go unthrottled. {repair}"
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

    #[test]
    fn issue15_a_sqlite_store_keeps_the_throttle_in_throttle_db_beside_it() {
        let home = tempfile::tempdir().unwrap();
        let host = HostConfig::empty("host.yaml");
        let plan = ThrottlePlan::for_store(home.path(), None, &host);
        assert_eq!(
            plan.backend,
            Backend::Sqlite(home.path().join("throttle.db"))
        );
        assert_eq!(ThrottlePlan::new(home.path(), &host).backend, plan.backend);
        assert!(plan.open().is_some());
        assert!(home.path().join("throttle.db").exists());
    }

    #[test]
    fn issue15_a_postgres_store_keeps_the_throttle_in_its_own_database() {
        let Some(db) = docsfab_pg::testing::fresh_database("plan_pg") else {
            return;
        };
        let home = tempfile::tempdir().unwrap();
        let plan =
            ThrottlePlan::for_store(home.path(), Some(&db.url), &HostConfig::empty("host.yaml"));
        assert_eq!(plan.backend, Backend::Postgres(db.url.clone()));
        assert!(plan.open().is_some());
        assert!(
            !home.path().join("throttle.db").exists(),
            "no file beside a PostgreSQL store"
        );
        let pg = docsfab_pg::Pg::connect(&db.url).unwrap();
        let tables: i64 = pg
            .call(|c| {
                c.query_one(
                    "SELECT count(*) FROM information_schema.tables
                     WHERE table_name IN ('throttle_permits', 'throttle_waiters', 'throttle_providers')",
                    &[],
                )
                .map(|r| r.get(0))
            })
            .unwrap();
        assert_eq!(tables, 3);
    }
}
