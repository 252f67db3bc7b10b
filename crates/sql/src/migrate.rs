//! The embedded migrations of `migrations/<dialect>/` and the runner that applies them
//! on start-up (and from `orderly migrate`). Each migration runs in the same
//! transaction as its bookkeeping row, under a lock, so concurrent start-ups apply it
//! once. A migration edited after it was applied, or a database migrated by a newer
//! orderly, stops start-up with a message saying so.

use orderly_core::{Error, Result};

/// One migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number; the same number means the same change in both dialects.
    pub version: i64,
    /// Its name (the file name without number and extension).
    pub name: &'static str,
    /// The SQL it runs.
    pub sql: &'static str,
}

impl Migration {
    /// A checksum of its SQL (64-bit FNV-1a, hex), stored when applied.
    pub fn checksum(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.sql.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// One change to the schema, written once per dialect (same number, name and file
/// name under `migrations/sqlite/` and `migrations/postgres/`).
#[derive(Clone, Copy)]
struct Both {
    version: i64,
    name: &'static str,
    sqlite: &'static str,
    postgres: &'static str,
}

/// Every migration, in order: the one list both dialects apply.
const ALL: [Both; 23] = [
    Both {
        version: 1,
        name: "state_store",
        sqlite: include_str!("../../../migrations/sqlite/0001_state_store.sql"),
        postgres: include_str!("../../../migrations/postgres/0001_state_store.sql"),
    },
    Both {
        version: 2,
        name: "queues",
        sqlite: include_str!("../../../migrations/sqlite/0002_queues.sql"),
        postgres: include_str!("../../../migrations/postgres/0002_queues.sql"),
    },
    Both {
        version: 3,
        name: "outbox",
        sqlite: include_str!("../../../migrations/sqlite/0003_outbox.sql"),
        postgres: include_str!("../../../migrations/postgres/0003_outbox.sql"),
    },
    Both {
        version: 4,
        name: "roles",
        sqlite: include_str!("../../../migrations/sqlite/0004_roles.sql"),
        postgres: include_str!("../../../migrations/postgres/0004_roles.sql"),
    },
    Both {
        version: 5,
        name: "leadership",
        sqlite: include_str!("../../../migrations/sqlite/0005_leadership.sql"),
        postgres: include_str!("../../../migrations/postgres/0005_leadership.sql"),
    },
    Both {
        version: 6,
        name: "generations",
        sqlite: include_str!("../../../migrations/sqlite/0006_generations.sql"),
        postgres: include_str!("../../../migrations/postgres/0006_generations.sql"),
    },
    Both {
        version: 7,
        name: "outbox_dead_letters",
        sqlite: include_str!("../../../migrations/sqlite/0007_outbox_dead_letters.sql"),
        postgres: include_str!("../../../migrations/postgres/0007_outbox_dead_letters.sql"),
    },
    Both {
        version: 8,
        name: "workflow_versions",
        sqlite: include_str!("../../../migrations/sqlite/0008_workflow_versions.sql"),
        postgres: include_str!("../../../migrations/postgres/0008_workflow_versions.sql"),
    },
    Both {
        version: 9,
        name: "retention",
        sqlite: include_str!("../../../migrations/sqlite/0009_retention.sql"),
        postgres: include_str!("../../../migrations/postgres/0009_retention.sql"),
    },
    Both {
        version: 10,
        name: "service_health",
        sqlite: include_str!("../../../migrations/sqlite/0010_service_health.sql"),
        postgres: include_str!("../../../migrations/postgres/0010_service_health.sql"),
    },
    Both {
        version: 11,
        name: "operations",
        sqlite: include_str!("../../../migrations/sqlite/0011_operations.sql"),
        postgres: include_str!("../../../migrations/postgres/0011_operations.sql"),
    },
    Both {
        version: 12,
        name: "in_place_steps",
        sqlite: include_str!("../../../migrations/sqlite/0012_in_place_steps.sql"),
        postgres: include_str!("../../../migrations/postgres/0012_in_place_steps.sql"),
    },
    Both {
        version: 13,
        name: "queue_tables_keep_pages",
        sqlite: include_str!("../../../migrations/sqlite/0013_queue_tables_keep_pages.sql"),
        postgres: include_str!("../../../migrations/postgres/0013_queue_tables_keep_pages.sql"),
    },
    Both {
        version: 14,
        name: "step_rows_updated_in_place",
        sqlite: include_str!("../../../migrations/sqlite/0014_step_rows_updated_in_place.sql"),
        postgres: include_str!("../../../migrations/postgres/0014_step_rows_updated_in_place.sql"),
    },
    Both {
        version: 15,
        name: "irreversible_steps",
        sqlite: include_str!("../../../migrations/sqlite/0015_irreversible_steps.sql"),
        postgres: include_str!("../../../migrations/postgres/0015_irreversible_steps.sql"),
    },
    Both {
        version: 16,
        name: "queue_locks_in_place",
        sqlite: include_str!("../../../migrations/sqlite/0016_queue_locks_in_place.sql"),
        postgres: include_str!("../../../migrations/postgres/0016_queue_locks_in_place.sql"),
    },
    Both {
        version: 17,
        name: "workflow_definitions",
        sqlite: include_str!("../../../migrations/sqlite/0017_workflow_definitions.sql"),
        postgres: include_str!("../../../migrations/postgres/0017_workflow_definitions.sql"),
    },
    Both {
        version: 18,
        name: "retry_after_undo",
        sqlite: include_str!("../../../migrations/sqlite/0018_retry_after_undo.sql"),
        postgres: include_str!("../../../migrations/postgres/0018_retry_after_undo.sql"),
    },
    Both {
        version: 19,
        name: "message_keys",
        sqlite: include_str!("../../../migrations/sqlite/0019_message_keys.sql"),
        postgres: include_str!("../../../migrations/postgres/0019_message_keys.sql"),
    },
    Both {
        version: 20,
        name: "customers",
        sqlite: include_str!("../../../migrations/sqlite/0020_customers.sql"),
        postgres: include_str!("../../../migrations/postgres/0020_customers.sql"),
    },
    Both {
        version: 21,
        name: "error_causes",
        sqlite: include_str!("../../../migrations/sqlite/0021_error_causes.sql"),
        postgres: include_str!("../../../migrations/postgres/0021_error_causes.sql"),
    },
    Both {
        version: 22,
        name: "finished_tally",
        sqlite: include_str!("../../../migrations/sqlite/0022_finished_tally.sql"),
        postgres: include_str!("../../../migrations/postgres/0022_finished_tally.sql"),
    },
    Both {
        version: 23,
        name: "system_alert_acks",
        sqlite: include_str!("../../../migrations/sqlite/0023_system_alert_acks.sql"),
        postgres: include_str!("../../../migrations/postgres/0023_system_alert_acks.sql"),
    },
];

/// One dialect's side of [`ALL`].
const fn dialect<const N: usize>(all: &[Both; N], sqlite: bool) -> [Migration; N] {
    let mut out = [Migration {
        version: 0,
        name: "",
        sql: "",
    }; N];
    let mut i = 0;
    while i < N {
        out[i] = Migration {
            version: all[i].version,
            name: all[i].name,
            sql: if sqlite {
                all[i].sqlite
            } else {
                all[i].postgres
            },
        };
        i += 1;
    }
    out
}

/// The SQLite migrations, in order.
pub const SQLITE: &[Migration] = &dialect(&ALL, true);

/// The PostgreSQL migrations, in order.
pub const POSTGRES: &[Migration] = &dialect(&ALL, false);

/// The bookkeeping table (same text in both dialects).
pub(crate) const CREATE_BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS orderly_migrations (\
    version BIGINT PRIMARY KEY NOT NULL, name TEXT NOT NULL, checksum TEXT NOT NULL, \
    applied_at TEXT NOT NULL)";

/// Which of `known` still need applying, given what the database records as applied.
pub(crate) fn pending<'m>(
    applied: &[(i64, String)],
    known: &'m [Migration],
) -> Result<Vec<&'m Migration>> {
    for (version, checksum) in applied {
        match known.iter().find(|m| m.version == *version) {
            None => {
                return Err(Error::Corrupt(format!(
                    "the database has migration {version}, which this orderly does not know: \
                     it was migrated by a newer version"
                )));
            }
            Some(m) if m.checksum() != *checksum => {
                return Err(Error::Corrupt(format!(
                    "migration {version} ({}) was changed after it was applied",
                    m.name
                )));
            }
            Some(_) => {}
        }
    }
    Ok(known
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dialect: &str) -> Vec<String> {
        let dir = format!("{}/../../migrations/{dialect}", env!("CARGO_MANIFEST_DIR"));
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn both_dialects_have_the_same_numbered_migrations_and_all_are_embedded() {
        let sqlite = files("sqlite");
        assert_eq!(sqlite, files("postgres"));
        let listed = |ms: &[Migration]| -> Vec<String> {
            ms.iter()
                .map(|m| format!("{:04}_{}.sql", m.version, m.name))
                .collect()
        };
        assert_eq!(listed(SQLITE), sqlite);
        assert_eq!(listed(POSTGRES), sqlite);
    }

    #[test]
    fn an_edited_or_unknown_migration_stops_start_up() {
        let applied = vec![(1, "0000".to_owned())];
        assert!(
            pending(&applied, SQLITE)
                .unwrap_err()
                .to_string()
                .contains("changed")
        );
        let applied = vec![(99, "x".to_owned())];
        assert!(
            pending(&applied, SQLITE)
                .unwrap_err()
                .to_string()
                .contains("newer")
        );
        let applied = vec![(1, SQLITE[0].checksum())];
        let versions = |ms: Vec<&Migration>| ms.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(
            versions(pending(&applied, SQLITE).unwrap()),
            (2..=SQLITE.len() as i64).collect::<Vec<_>>(),
            "only the newer ones"
        );
        assert_eq!(
            versions(pending(&[], SQLITE).unwrap()),
            (1..=SQLITE.len() as i64).collect::<Vec<_>>()
        );
        assert_eq!(
            SQLITE.len(),
            POSTGRES.len(),
            "both dialects numbered the same"
        );
        let all: Vec<_> = SQLITE.iter().map(|m| (m.version, m.checksum())).collect();
        assert!(pending(&all, SQLITE).unwrap().is_empty());
    }
}
