//! Conformance cases for leadership in the state store: terms whose epochs only grow,
//! the SQL elector's lease row on the store's clock, and the fencing of every leader's
//! write.

use std::collections::HashSet;
use std::time::Duration;

use orderly_core::{Clock, Epoch, Error, ProcessState};

use super::{Ctx, SUPERVISOR, claim_one, leader, owner, policy, row, submit_n, supervisor};

const LEASE: Duration = Duration::from_secs(15);

/// Every new term, whoever begins it, has a larger epoch; the store reports it.
pub async fn every_new_term_has_a_larger_epoch(ctx: &Ctx) {
    let store = ctx.store().await;
    assert_eq!(store.term(SUPERVISOR).await.unwrap(), None);
    let mut last = Epoch(0);
    for n in [0, 1, 0, 2, 2] {
        let term = leader(&*store, n).await;
        assert!(term.epoch > last, "{term} after {last}");
        last = term.epoch;
        let stored = store.term(SUPERVISOR).await.unwrap().unwrap();
        assert_eq!(stored.fence, term);
        assert_eq!(
            stored.lease_expires_at, None,
            "a blob term has no SQL lease"
        );
    }
    let other = store.begin_term("other", &supervisor(0)).await.unwrap();
    assert_eq!(
        other.epoch,
        Epoch(1),
        "each leadership counts its own terms"
    );
}

/// A leader whose term is over can neither recover orders nor mark alerts, and its
/// refused sweep changes nothing; the new leader's does.
pub async fn a_deposed_leaders_writes_are_refused_and_change_nothing(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 3).await;
    for _ in 0..3 {
        claim_one(&*store, &owner("a"), Duration::from_secs(5)).await;
    }
    ctx.clock.advance(Duration::from_secs(6));
    let old = leader(&*store, 1).await;
    let new = leader(&*store, 2).await;
    let refused = store.recover_expired(&old, &policy(5, 1), 10).await;
    assert!(
        matches!(&refused, Err(Error::Deposed { epoch, .. }) if *epoch == old.epoch),
        "{refused:?}"
    );
    assert!(
        refused.unwrap_err().to_string().contains("refused"),
        "the error says what happened"
    );
    assert_eq!(store.find_expired(10).await.unwrap().len(), 3, "untouched");
    assert!(matches!(
        store.mark_alerts_published(&old, &[1], &[]).await,
        Err(Error::Deposed { .. })
    ));
    // A forged term (right epoch, wrong holder) is refused too.
    let forged = orderly_core::leader::LeaderFence {
        holder: supervisor(9),
        ..new.clone()
    };
    assert!(matches!(
        store.recover_expired(&forged, &policy(5, 1), 10).await,
        Err(Error::Deposed { .. })
    ));
    let recovered = store
        .recover_expired(&new, &policy(5, 1), 10)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 3);
    for r in &recovered {
        let state = row(&*store, r.order_id()).await;
        assert_eq!(
            (state.process_state, state.failure_count),
            (ProcessState::Pending, 1)
        );
        let history = store.get(r.order_id()).await.unwrap().history;
        assert_eq!(
            history.last().unwrap().actor.as_str(),
            supervisor(2).as_str(),
            "the recovery is the new leader's"
        );
    }
}

/// The SQL lease: one holder while it lasts on the store's clock; renewals keep it;
/// after its expiry another takes it under a new epoch and the old holder can neither
/// renew it nor write, even before anyone else has taken over.
pub async fn the_sql_lease_has_one_holder_until_it_expires_on_the_store_clock(ctx: &Ctx) {
    let store = ctx.store().await;
    let (a, b) = (supervisor(1), supervisor(2));
    let ta = store
        .acquire_lease(SUPERVISOR, &a, LEASE)
        .await
        .unwrap()
        .expect("free: a takes it");
    assert_eq!(
        store.acquire_lease(SUPERVISOR, &b, LEASE).await.unwrap(),
        None
    );
    assert_eq!(
        store.acquire_lease(SUPERVISOR, &a, LEASE).await.unwrap(),
        None,
        "not even its holder takes a running lease twice"
    );
    let stored = store.term(SUPERVISOR).await.unwrap().unwrap();
    assert_eq!(stored.fence, ta);
    assert_eq!(
        stored.lease_expires_at,
        Some(ctx.clock.now() + chrono::Duration::seconds(15))
    );
    // Renewed at 10 s: holds until 25 s.
    ctx.clock.advance(Duration::from_secs(10));
    assert!(store.renew_lease(&ta, LEASE).await.unwrap());
    ctx.clock.advance(Duration::from_secs(10));
    assert_eq!(
        store.acquire_lease(SUPERVISOR, &b, LEASE).await.unwrap(),
        None
    );
    store.recover_expired(&ta, &policy(5, 1), 10).await.unwrap();
    // Expired at 25 s: a's writes are refused at once, and it cannot renew.
    ctx.clock.advance(Duration::from_secs(6));
    assert!(matches!(
        store.recover_expired(&ta, &policy(5, 1), 10).await,
        Err(Error::Deposed { .. })
    ));
    assert!(
        !store.renew_lease(&ta, LEASE).await.unwrap(),
        "an expired lease stays lost"
    );
    let tb = store
        .acquire_lease(SUPERVISOR, &b, LEASE)
        .await
        .unwrap()
        .expect("expired: b takes it");
    assert!(tb.epoch > ta.epoch);
    assert!(!store.renew_lease(&ta, LEASE).await.unwrap());
    store.recover_expired(&tb, &policy(5, 1), 10).await.unwrap();
}

/// Releasing a SQL lease lets another take it at once; releasing a term that is over
/// does nothing.
pub async fn a_released_sql_lease_is_taken_at_once(ctx: &Ctx) {
    let store = ctx.store().await;
    let ta = store
        .acquire_lease(SUPERVISOR, &supervisor(1), LEASE)
        .await
        .unwrap()
        .unwrap();
    assert!(store.release_lease(&ta).await.unwrap());
    assert!(matches!(
        store.recover_expired(&ta, &policy(5, 1), 10).await,
        Err(Error::Deposed { .. })
    ));
    let tb = store
        .acquire_lease(SUPERVISOR, &supervisor(2), LEASE)
        .await
        .unwrap()
        .expect("released: taken at once");
    assert!(
        !store.release_lease(&ta).await.unwrap(),
        "a stale release changes nothing"
    );
    assert!(
        store.renew_lease(&tb, LEASE).await.unwrap(),
        "a stale release touched nothing"
    );
    // A blob term begun meanwhile ends the SQL lease's term.
    let blob = leader(&*store, 3).await;
    assert!(blob.epoch > tb.epoch);
    assert!(!store.renew_lease(&tb, LEASE).await.unwrap());
    assert_eq!(
        store
            .acquire_lease(SUPERVISOR, &supervisor(2), LEASE)
            .await
            .unwrap(),
        None,
        "a term of another elector is not an expired SQL lease"
    );
}

/// Eight instances racing for a free SQL lease: exactly one wins, once.
pub async fn eight_racing_acquirers_get_one_sql_lease(ctx: &Ctx) {
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = ctx.store().await;
        tasks.push(tokio::spawn(async move {
            store
                .acquire_lease(SUPERVISOR, &supervisor(n), LEASE)
                .await
                .unwrap()
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        winners.extend(t.await.unwrap());
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let holders: HashSet<_> = winners.iter().map(|w| w.holder.clone()).collect();
    assert_eq!(holders.len(), 1);
}
