//! Property-based fuzzing of the settings that hold secrets: the lease storage
//! connection string, the Service Bus connection string and the database URL. Each
//! case is built from the fields such a setting holds (known keys, misspelt ones,
//! values with separators, quotes, control and bidi characters, empty parts) or is
//! arbitrary text, always with a planted secret (an account key, a SAS signature, a
//! password). The parsers must not panic, and an error must never show the secret.
//! `ORDERLY_FUZZ_CASES` sets the cases (10,000 by default).

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use orderly_azure::{BlobLocation, ServiceBusSettings};

const SECRET: &str = "Pl4ntedS3cretZq";

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: std::env::var("ORDERLY_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000),
        failure_persistence: None,
        ..Config::default()
    })
}

/// A value a field could hold: the secret, a URL, text with separators and odd
/// characters, or anything.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(SECRET.to_owned()),
        Just(format!("{SECRET}==")),
        Just("https://acct.blob.core.windows.net".to_owned()),
        Just("http://127.0.0.1:10000/devstoreaccount1".to_owned()),
        Just("sb://ns.servicebus.windows.net/".to_owned()),
        Just(format!("sv=2022-11-02&sig={SECRET}")),
        Just("true".to_owned()),
        Just(String::new()),
        "[=;\"' \\t\\n\u{202e}\u{200b}a-zA-Z0-9:/._%?&-]{0,40}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("UseDevelopmentStorage"),
        Just("DevelopmentStorageProxyUri"),
        Just("AccountName"),
        Just("AccountKey"),
        Just("BlobEndpoint"),
        Just("DefaultEndpointsProtocol"),
        Just("EndpointSuffix"),
        Just("SharedAccessSignature"),
        Just("Endpoint"),
        Just("SharedAccessKeyName"),
        Just("SharedAccessKey"),
        Just("EntityPath"),
        Just("accountkey"),
        Just(""),
    ]
    .prop_map(str::to_owned)
}

/// A connection string of `key=value` parts (some without `=`), always holding the
/// secret in one of them, or arbitrary text around the secret.
fn connection_string() -> impl Strategy<Value = String> {
    let parts = prop::collection::vec((key(), value(), any::<bool>()), 0..8).prop_map(|parts| {
        let mut s: Vec<String> = parts
            .into_iter()
            .map(|(k, v, eq)| {
                if eq {
                    format!("{k}={v}")
                } else {
                    format!("{k}{v}")
                }
            })
            .collect();
        s.push(format!("AccountKey={SECRET}"));
        s.join(";")
    });
    prop_oneof![parts, "(?s).{0,200}".prop_map(|t| format!("{t}{SECRET}")),]
}

/// A database URL with the secret as its password, cut or edited anywhere.
fn database_url() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![
        Just("postgres://"),
        Just("postgresql://"),
        Just("sqlite:"),
        Just("sqlite://"),
        Just("mysql://"),
        Just(""),
    ];
    (scheme, value(), value(), value()).prop_map(|(scheme, host, port, query)| {
        format!("{scheme}orderly:{SECRET}@{host}:{port}/orderly?{query}")
    })
}

#[test]
fn lease_connection_strings_parse_or_are_refused_without_showing_the_secret() {
    runner()
        .run(&connection_string(), |cs| {
            if let Err(e) = BlobLocation::from_connection_string(&cs, "orderly", "leader") {
                let text = format!("{e} {e:?}");
                prop_assert!(!text.contains(SECRET), "{}", text);
                prop_assert!(!text.is_empty());
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn servicebus_connection_strings_are_checked_without_showing_the_secret() {
    runner()
        .run(&connection_string(), |cs| {
            let cs = cs.replace("AccountKey=", "SharedAccessKey=");
            if let Err(e) =
                ServiceBusSettings::check_connection(&cs, "ORDERLY_SERVICEBUS_CONNECTION")
            {
                let text = format!("{e} {e:?}");
                prop_assert!(!text.contains(SECRET), "{}", text);
                prop_assert!(text.contains("ORDERLY_SERVICEBUS_CONNECTION"), "{}", text);
            }
            let settings = ServiceBusSettings::new(cs);
            let shown = format!("{settings:?}");
            prop_assert!(!shown.contains(SECRET), "{}", shown);
            Ok(())
        })
        .unwrap();
}

#[test]
fn database_urls_are_checked_without_showing_the_password() {
    runner()
        .run(&database_url(), |url| {
            if let Err(e) = orderly_sql::check_url(&url) {
                let text = format!("{e} {e:?}");
                prop_assert!(!text.contains(SECRET), "{}", text);
                prop_assert!(text.contains("database_url"), "{}", text);
            }
            Ok(())
        })
        .unwrap();
}
