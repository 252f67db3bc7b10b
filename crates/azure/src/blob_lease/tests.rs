//! Connection strings, SAS URLs and SharedKey signing, without a service.

use std::time::Duration;

use azure_core::http::{Request, Url};

use super::shared_key::string_to_sign;
use super::*;

#[test]
fn connection_strings_give_the_endpoint_and_name_the_setting_when_wrong() {
    let dev =
        BlobLocation::from_connection_string("UseDevelopmentStorage=true", "leases", "leader")
            .unwrap();
    assert_eq!(
        dev.container_url.as_str(),
        "http://127.0.0.1:10000/devstoreaccount1/leases"
    );
    assert_eq!(
        dev.blob_url().as_str(),
        "http://127.0.0.1:10000/devstoreaccount1/leases/leader"
    );
    let prod = BlobLocation::from_connection_string(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net",
        "leases",
        "leader",
    )
    .unwrap();
    assert_eq!(
        prod.container_url.as_str(),
        "https://acct.blob.core.windows.net/leases"
    );
    assert!(
        !format!("{prod:?}").contains("a2V5"),
        "the key is never printed"
    );
    let err =
        BlobLocation::from_connection_string("AccountName=acct", "leases", "leader").unwrap_err();
    assert_eq!(err.setting, "lease storage connection string");
    assert!(err.reason.contains("AccountKey"));
    let err = BlobLocation::from_connection_string("UseDevelopmentStorage=true", "Bad_Name", "x")
        .unwrap_err();
    assert_eq!(err.setting, "lease container");
    let sas = BlobLocation::from_sas_url(
        "https://acct.blob.core.windows.net/leases?sv=2024&sig=abc",
        "leader",
    )
    .unwrap();
    assert_eq!(
        sas.blob_url().as_str(),
        "https://acct.blob.core.windows.net/leases/leader?sv=2024&sig=abc"
    );
    assert!(
        !format!("{sas:?}").contains("sig"),
        "the SAS is never printed"
    );
    assert_eq!(
        BlobLocation::from_sas_url("https://acct.blob.core.windows.net/leases", "leader")
            .unwrap_err()
            .setting,
        "lease SAS URL"
    );
}

#[test]
fn the_string_to_sign_follows_the_shared_key_layout() {
    let url =
        Url::parse("http://127.0.0.1:10000/devstoreaccount1/leases/leader?comp=lease&timeout=3")
            .unwrap();
    let mut request = Request::new(url, azure_core::http::Method::Put);
    request.insert_header("x-ms-version", "2026-04-06");
    request.insert_header("x-ms-lease-action", "acquire");
    request.insert_header("x-ms-date", "Sun, 22 Nov 2026 21:00:00 GMT");
    request.insert_header("if-match", "\"etag\"");
    assert_eq!(
        string_to_sign("devstoreaccount1", &request),
        "PUT\n\n\n\n\n\n\n\n\"etag\"\n\n\n\n\
         x-ms-date:Sun, 22 Nov 2026 21:00:00 GMT\nx-ms-lease-action:acquire\nx-ms-version:2026-04-06\n\
         /devstoreaccount1/devstoreaccount1/leases/leader\ncomp:lease\ntimeout:3"
    );
}

#[test]
fn a_blob_lease_outside_15_to_60_whole_seconds_is_refused() {
    let loc =
        BlobLocation::from_connection_string("UseDevelopmentStorage=true", "leases", "leader")
            .unwrap();
    for bad in [14_000, 61_000, 15_500] {
        let err =
            BlobLease::new(&loc, Duration::from_millis(bad), Duration::from_secs(3)).unwrap_err();
        assert_eq!(err.setting, "lease");
    }
    assert!(BlobLease::new(&loc, Duration::from_secs(15), Duration::from_secs(3)).is_ok());
}
