//! Leader election between real `orderly-supervisor` processes, with the SQL lease
//! (SQLite and PostgreSQL) and the blob lease (Azurite): a graceful stop hands over
//! within 3 s, a SIGKILLed leader is replaced within lease + retry, and a leader
//! SIGSTOPped past its lease has its writes refused and steps down within 1 s of
//! SIGCONT. Leadership is read from the processes' JSON logs.

use std::time::{Duration, Instant};

use orderly_core::history::HistoryKind;
use orderly_core::leader::LeaderFence;
use orderly_core::store::{ClaimRequest, RecoveryPolicy, StateStore};
use orderly_core::{Epoch, Error, InstanceId, ProcessState};
use orderly_testkit::azurite::Azurite;

use crate::fixtures::{Db, Dialect};
use crate::procs::{Election, changes, wait_change};

async fn setup(dialect: Dialect) -> (Db, std::sync::Arc<dyn StateStore>) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    (db, backend.store)
}

/// A graceful stop (SIGTERM) of the leader: it releases the lease and the follower
/// leads within 3 s, with the default acquire retry (2 s plus up to 20 %).
async fn graceful(election: Election, dialect: Dialect) {
    let (db, _store) = setup(dialect).await;
    let election = election.with("--acquire-retry-ms", 2000);
    let a = election.start(&db.url, "supervisor-a");
    let (_, first) = wait_change(&a, 1, Duration::from_secs(20)).await;
    assert!(first.acquired);
    let mut b = election.start(&db.url, "supervisor-b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(changes(&b).is_empty(), "b follows while a leads");
    let stopped = Instant::now();
    a.signal("TERM");
    let (seen, took_over) = wait_change(&b, 1, Duration::from_secs(5)).await;
    let failover = seen - stopped;
    assert!(took_over.acquired && took_over.epoch > first.epoch);
    assert!(
        failover < Duration::from_secs(3),
        "failover took {failover:?}"
    );
    let mut a = a;
    assert!(a.wait(Duration::from_secs(5)).success(), "a exits cleanly");
    let a_changes = changes(&a);
    assert_eq!(
        a_changes.last().unwrap().reason.as_deref(),
        Some("shutdown")
    );
    b.signal("TERM");
    b.wait(Duration::from_secs(5));
}

/// SIGKILL of the leader: nothing is released; the follower leads once the lease has
/// expired, within lease + retry (+ jitter and a little slack).
async fn killed(election: Election, dialect: Dialect) {
    let (db, _store) = setup(dialect).await;
    let a = election.start(&db.url, "supervisor-a");
    let (_, first) = wait_change(&a, 1, Duration::from_secs(20)).await;
    let b = election.start(&db.url, "supervisor-b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    a.kill();
    let limit = election.lease() + election.retry().mul_f64(1.2) + Duration::from_secs(1);
    let (seen, took_over) = wait_change(&b, 1, limit + Duration::from_secs(5)).await;
    let failover = seen - killed;
    assert!(took_over.acquired && took_over.epoch > first.epoch);
    assert!(
        failover <= limit,
        "failover took {failover:?}, limit {limit:?}"
    );
    drop(b);
}

/// A leader frozen (SIGSTOP) past its lease while work expires: the follower takes over
/// and recovers it; when the old leader resumes (SIGCONT) it steps down within 1 s and
/// none of its writes is accepted, including a write made directly with its old term.
async fn frozen(election: Election, dialect: Dialect) {
    let (db, store) = setup(dialect).await;
    let mut ids = Vec::new();
    for o in orderly_local::demo::sample_orders(20) {
        store
            .submit(&o, &orderly_core::Actor::operator("test"), &[])
            .await
            .unwrap();
        ids.push(o.order_id);
    }
    let a = election.start(&db.url, "supervisor-a");
    let (_, first) = wait_change(&a, 1, Duration::from_secs(20)).await;
    let b = election.start(&db.url, "supervisor-b");
    tokio::time::sleep(Duration::from_millis(700)).await;
    a.signal("STOP");
    let ghost = InstanceId::parse("scheduler-ghost").unwrap();
    let claim = |limit: u32| ClaimRequest {
        workflows: Default::default(),
        owner: ghost.clone(),
        limit,
        timeout: Duration::from_millis(300),
    };
    assert_eq!(store.claim(&claim(10)).await.unwrap().len(), 10);
    let (_, took_over) = wait_change(&b, 1, election.lease() + Duration::from_secs(10)).await;
    assert!(took_over.acquired && took_over.epoch > first.epoch);
    crate::procs::wait_for(
        "the new leader's recoveries",
        Duration::from_secs(10),
        async || store.find_expired(100).await.unwrap().is_empty(),
    )
    .await;
    // More work expires just as the old leader wakes: it and the new one race for it.
    assert_eq!(store.claim(&claim(10)).await.unwrap().len(), 10);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let resumed = Instant::now();
    a.signal("CONT");
    let (seen, ended) = wait_change(&a, 2, Duration::from_secs(5)).await;
    assert!(!ended.acquired && ended.epoch == first.epoch);
    let stepped_down = seen - resumed;
    assert!(
        stepped_down <= Duration::from_secs(1),
        "stepped down {stepped_down:?} after resuming ({:?})",
        ended.reason
    );
    crate::procs::wait_for(
        "every expiry recovered",
        Duration::from_secs(10),
        async || store.find_expired(100).await.unwrap().is_empty(),
    )
    .await;
    // Every recovery is the new leader's.
    for id in &ids {
        let view = store.get(id).await.unwrap();
        for h in view
            .history
            .iter()
            .filter(|h| matches!(h.kind, HistoryKind::Recovered | HistoryKind::GaveUp))
        {
            assert_eq!(h.actor.as_str(), "supervisor-b", "{id}: {h:?}");
        }
        assert!(view.state.failure_count <= 2);
        assert_ne!(view.state.process_state, ProcessState::Processing);
    }
    // A write under the old term, made now, is refused by the store.
    let stale = LeaderFence {
        name: orderly_supervisor::LEADERSHIP.into(),
        holder: InstanceId::parse("supervisor-a").unwrap(),
        epoch: Epoch(first.epoch),
    };
    let refused = store
        .recover_expired(&stale, &RecoveryPolicy::default(), 10)
        .await;
    assert!(matches!(refused, Err(Error::Deposed { .. })), "{refused:?}");
    // If the old leader's sweep ran before it noticed, the store refused it.
    let out = a.output();
    assert!(
        !out.contains("deadline passed: order back to Pending"),
        "the stale leader recovered an order:\n{out}"
    );
    drop((a, b));
}

mod sql_lease {
    use super::*;

    crate::both!(
        a_gracefully_stopped_leader_hands_over_within_3_s,
        graceful_sql
    );
    async fn graceful_sql(d: Dialect) {
        graceful(Election::sql(), d).await
    }

    crate::both!(
        a_sigkilled_leader_is_replaced_within_lease_and_retry,
        killed_sql
    );
    async fn killed_sql(d: Dialect) {
        killed(Election::sql(), d).await
    }

    crate::both!(
        a_leader_frozen_past_its_lease_is_fenced_and_steps_down_on_resuming,
        frozen_sql
    );
    async fn frozen_sql(d: Dialect) {
        frozen(Election::sql(), d).await
    }
}

mod blob_lease {
    use super::*;

    /// A leader cut off from its lease (a partition between it and Blob Storage, its
    /// process and its database link alive) steps down on its own, within its renew
    /// deadline and before its lease can end, so the follower, which takes over only
    /// once the lease has ended, never leads beside it; work that expires meanwhile is
    /// recovered once; healed, the old leader follows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_leader_cut_off_from_its_lease_steps_down_before_the_lease_ends() {
        let azurite = Azurite::start();
        let partition = crate::procs::Partition::to(azurite.port).await;
        let election = Election::blob(azurite);
        let (db, store) = setup(Dialect::Sqlite).await;
        let mut ids = Vec::new();
        for o in orderly_local::demo::sample_orders(10) {
            store
                .submit(&o, &orderly_core::Actor::operator("test"), &[])
                .await
                .unwrap();
            ids.push(o.order_id);
        }
        // a reaches the blob through the partition; b directly.
        let mut args = election.args("supervisor-a");
        let direct = election.azurite.as_ref().unwrap().connection_string();
        let through = direct.replace(
            &format!(":{}", election.azurite.as_ref().unwrap().port),
            &format!(":{}", partition.port),
        );
        assert_ne!(direct, through);
        for a in args.iter_mut().filter(|a| **a == direct) {
            *a = through.clone();
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = crate::procs::Proc::start("orderly-supervisor", &db.url, &args);
        let (_, first) = wait_change(&a, 1, Duration::from_secs(20)).await;
        assert!(first.acquired);
        let b = election.start(&db.url, "supervisor-b");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(changes(&b).is_empty(), "b follows while a leads");

        let cut = Instant::now();
        partition.cut();
        // Work expires during the partition.
        let ghost = InstanceId::parse("scheduler-ghost").unwrap();
        let claimed = store
            .claim(&ClaimRequest {
                workflows: Default::default(),
                owner: ghost,
                limit: 10,
                timeout: Duration::from_millis(300),
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 10);
        let (a_seen, ended) = wait_change(&a, 2, Duration::from_secs(20)).await;
        assert!(!ended.acquired && ended.epoch == first.epoch, "{ended:?}");
        let (b_seen, took_over) = wait_change(&b, 1, Duration::from_secs(30)).await;
        assert!(took_over.acquired && took_over.epoch > first.epoch);
        // a renewed at most a renew interval (1 s) before the cut: its lease ran to at
        // least cut + 14 s; its renew deadline is 10 s (+ one 1 s call).
        let stepped_down = a_seen - cut;
        assert!(
            stepped_down <= Duration::from_secs(12),
            "a stepped down {stepped_down:?} after the cut ({:?})",
            ended.reason
        );
        assert!(
            a_seen + Duration::from_secs(1) < b_seen,
            "no two leaders: a ended {:?} after the cut, b took over {:?} after it",
            a_seen - cut,
            b_seen - cut
        );
        assert!(
            b_seen - cut >= Duration::from_secs(13),
            "b waited for the lease to end: {:?}",
            b_seen - cut
        );
        crate::procs::wait_for(
            "every expiry recovered",
            Duration::from_secs(15),
            async || store.find_expired(100).await.unwrap().is_empty(),
        )
        .await;
        // Each order expired once, and was recovered once, by whoever led then.
        for id in &ids {
            let view = store.get(id).await.unwrap();
            let recoveries = view
                .history
                .iter()
                .filter(|h| matches!(h.kind, HistoryKind::Recovered | HistoryKind::GaveUp))
                .count();
            assert_eq!(recoveries, 1, "{id}: {:?}", view.history);
            assert_eq!(view.state.failure_count, 1, "{id}");
        }

        // Healed: a follows (it may not lead while b renews).
        partition.heal();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(changes(&a).len(), 2, "a follows after the partition heals");
        assert_eq!(changes(&b).len(), 1, "b still leads");
        drop((a, b));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_gracefully_stopped_leader_hands_over_within_3_s() {
        graceful(Election::blob(Azurite::start()), Dialect::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_sigkilled_leader_is_replaced_within_lease_and_retry() {
        killed(Election::blob(Azurite::start()), Dialect::Sqlite).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_leader_frozen_past_its_lease_is_fenced_and_steps_down_on_resuming() {
        frozen(Election::blob(Azurite::start()), Dialect::Sqlite).await
    }

    /// The supervisor as built by default, against Azurite serving HTTPS only with a
    /// certificate of the test's own CA: told to trust that CA (`ORDERLY_CA_FILE`), it
    /// becomes leader and hands over on SIGTERM like over HTTP; not told, it never
    /// leads, and says why (the certificate), for as long as it runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_supervisor_leads_over_https_only_when_it_trusts_the_lease_endpoint() {
        let (ca, azurite) = Azurite::start_https_with_new_ca("blob-e2e");
        let cs = azurite.connection_string();
        assert!(cs.contains("https://"), "{cs}");
        let (db, _store) = setup(Dialect::Sqlite).await;

        let election = Election::blob(azurite);
        // Its elector's debug lines count the tries that failed the same way again.
        let args = election.args("supervisor-untrusting");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let untrusting = crate::procs::Proc::start_with(
            "orderly-supervisor",
            &db.url,
            &args,
            &[(
                "ORDERLY_LOG",
                &format!(
                    "{},orderly_core::leader=debug",
                    orderly_runtime::DEFAULT_LOG_FILTER
                ),
            )],
        );
        crate::procs::wait_for(
            "the untrusting supervisor to report the certificate",
            Duration::from_secs(20),
            async || untrusting.output().to_lowercase().contains("certificate"),
        )
        .await;
        assert!(
            changes(&untrusting).is_empty(),
            "it led without trusting the endpoint"
        );

        // The same supervisor, told to trust the CA, leads: TLS is what stood between.
        let trusting = election.with_env("ORDERLY_CA_FILE", ca.ca_file().display().to_string());
        let a = trusting.start(&db.url, "supervisor-a");
        let (_, first) = wait_change(&a, 1, Duration::from_secs(20)).await;
        assert!(first.acquired, "{}", a.output());
        assert!(changes(&untrusting).is_empty());
        let b = trusting.start(&db.url, "supervisor-b");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(changes(&b).is_empty(), "b follows while a leads");
        a.signal("TERM");
        let (_, took_over) = wait_change(&b, 1, Duration::from_secs(10)).await;
        assert!(took_over.acquired && took_over.epoch > first.epoch);
        // Retrying every 500 ms: the failure is said once, as it began, with its cause
        // (the certificate), and each repeat only at debug; the Azure SDK's own line per
        // failed try, without a cause, not at all.
        crate::procs::wait_for(
            "the untrusting supervisor to fail three more tries",
            Duration::from_secs(30),
            async || {
                untrusting
                    .output()
                    .matches("acquiring the lease still fails")
                    .count()
                    >= 3
            },
        )
        .await;
        let said = untrusting.output();
        assert!(
            !said.contains("Failed response"),
            "the SDK's line per try: {said}"
        );
        let warned: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("acquiring the lease failed"))
            .collect();
        assert_eq!(warned.len(), 1, "said once: {said}");
        assert!(
            warned[0].to_lowercase().contains("certificate") && warned[0].contains("\"WARN\""),
            "with its cause: {}",
            warned[0]
        );
        let repeats = said
            .lines()
            .filter(|l| l.contains("acquiring the lease still fails"))
            .count();
        assert!(repeats >= 3, "{repeats} repeats at debug: {said}");
        drop(untrusting);
        b.signal("TERM");
    }
}
