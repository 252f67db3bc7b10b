//! Conformance cases for workflow versions: a claim and its first step together,
//! claims of loaded versions only, and moves to a compatible version.

use super::{Ctx, MINUTE, owner, row, submit_n};
use super::{start_first, update, write};
use orderly_core::history::HistoryKind;
use orderly_core::step::StepStatus;
use orderly_core::{Actor, Error, ProcessState};
use std::sync::Arc;
use std::time::Duration;

/// A claim and its first step commit together: the orders it claims have their step
/// started in the same transaction; if a planned write cannot be applied, nothing is
/// claimed at all.
pub async fn a_claim_and_its_first_step_commit_together(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 3).await;
    let a = owner("a");
    let request = orderly_core::store::ClaimRequest {
        workflows: Default::default(),
        owner: a.clone(),
        limit: 2,
        timeout: MINUTE,
    };
    // A plan that cannot apply (it expects another step): nothing is claimed.
    let wrong = |c: &orderly_core::store::ClaimedOrder| {
        Some(write(
            &c.fence,
            Some(5),
            vec![update(5, StepStatus::Started)],
        ))
    };
    assert!(store.claim_and_start(&request, &wrong).await.is_err());
    for id in &ids {
        assert_eq!(row(&*store, id).await.process_state, ProcessState::Pending);
    }
    // The plan starts step 0 of the first order it sees, nothing for the others.
    let first = std::sync::Mutex::new(true);
    let plan = |c: &orderly_core::store::ClaimedOrder| {
        let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *first, false).then(|| start_first(&c.fence))
    };
    // Away from the host's time: the claim and its step are written at the store's.
    ctx.clock.advance(Duration::from_secs(3_600));
    let at = orderly_core::clock::truncate_micros(orderly_core::Clock::now(&ctx.clock));
    let claimed = store.claim_and_start(&request, &plan).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed.iter().filter(|(_, started)| *started).count(), 1);
    for (c, started) in &claimed {
        let r = row(&*store, &c.fence.order_id).await;
        assert_eq!(
            (r.process_state, r.lock_epoch),
            (ProcessState::Processing, c.fence.epoch)
        );
        let steps = store.steps(&c.fence.order_id).await.unwrap();
        assert_eq!(steps.len(), usize::from(*started), "{steps:?}");
        let written: Vec<_> = store
            .get(&c.fence.order_id)
            .await
            .unwrap()
            .history
            .into_iter()
            .filter(|e| matches!(e.kind, HistoryKind::Claimed | HistoryKind::StepStarted))
            .map(|e| (e.kind, e.at))
            .collect();
        let mut expected = vec![(HistoryKind::Claimed, at)];
        if *started {
            expected.push((HistoryKind::StepStarted, at));
        }
        assert_eq!(written, expected);
    }
}

/// A claim takes only orders of the workflows the claimant runs: a new order is pinned
/// to the version the claimant starts it on (the default workflow for an order that
/// names none), and once pinned it is taken only by a claimant that carries that
/// version on, however often it goes back to Pending. The rest wait, counted by
/// `workflows_in_flight`.
pub async fn claims_take_only_loaded_workflows_and_pin_new_orders(ctx: &Ctx) {
    use orderly_core::store::{ClaimRequest, WorkflowCount};
    use orderly_core::workflow::{Workflow, Workflows};
    let store = ctx.store().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[2].timeout_ms += 5_000;
    let mut gift = Workflow {
        name: "gift".into(),
        ..Workflow::default()
    };
    gift.steps.truncate(2);
    let submit = |id: &str, workflow: Option<&str>| {
        let mut o = crate::builders::order_with_id(id, 1);
        o.workflow = workflow.map(str::to_owned);
        o
    };
    for o in [
        submit("plain", None),
        submit("wrapped", Some("gift")),
        submit("returned", Some("returns")),
    ] {
        store
            .submit(&o, &crate::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let a = owner("a");
    let claim = |workflows: Vec<Workflow>| ClaimRequest {
        owner: a.clone(),
        limit: 10,
        timeout: MINUTE,
        workflows: std::sync::Arc::new(Workflows::new(workflows).unwrap().filter()),
    };
    let ids = |claimed: &[orderly_core::store::ClaimedOrder]| {
        let mut ids: Vec<String> = claimed
            .iter()
            .map(|c| c.fence.order_id.as_str().to_owned())
            .collect();
        ids.sort();
        ids
    };

    // Runs v1 only: takes the order that names no workflow and pins it to v1.
    let claimed = store.claim(&claim(vec![v1.clone()])).await.unwrap();
    assert_eq!(ids(&claimed), ["plain"]);
    assert_eq!(claimed[0].workflow, Some(v1.reference()));
    let plain = row(&*store, &claimed[0].fence.order_id).await;
    assert_eq!(
        (plain.workflow.as_deref(), plain.workflow_version.as_deref()),
        (Some("order"), Some(v1.version().as_str()))
    );
    store
        .release(&claimed[0].fence, "handed back")
        .await
        .unwrap();

    // Runs v2 and gift: the v1 order is not its to take; the gift order is.
    let claimed = store
        .claim(&claim(vec![v2.clone(), gift.clone()]))
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ["wrapped"]);
    assert_eq!(claimed[0].workflow, Some(gift.reference()));

    // Runs v2 and still carries v1 on: takes the v1 order, whose pin stays v1.
    let claimed = store
        .claim(&claim(vec![v2.clone(), v1.clone()]))
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ["plain"]);
    assert_eq!(claimed[0].workflow, Some(v1.reference()));
    assert_eq!(
        row(&*store, &claimed[0].fence.order_id)
            .await
            .workflow_version
            .as_deref(),
        Some(v1.version().as_str())
    );

    // Nobody runs "returns": it waits, and the count says so.
    let mut counts = store.workflows_in_flight().await.unwrap();
    counts.sort_by(|x, y| x.workflow.cmp(&y.workflow));
    assert_eq!(
        counts,
        vec![
            WorkflowCount {
                workflow: Some("gift".into()),
                version: Some(gift.version()),
                state: ProcessState::Processing,
                orders: 1,
            },
            WorkflowCount {
                workflow: Some("order".into()),
                version: Some(v1.version()),
                state: ProcessState::Processing,
                orders: 1,
            },
            WorkflowCount {
                workflow: Some("returns".into()),
                version: None,
                state: ProcessState::Pending,
                orders: 1,
            },
        ]
    );
}

/// An operator moves orders to a compatible version: only Pending and Error ones of the
/// version named, each with a history entry; an incompatible or unstored version, or
/// orders in Processing, are refused before anything moves.
pub async fn orders_move_only_to_a_stored_compatible_version_and_say_so(ctx: &Ctx) {
    use orderly_core::store::ClaimRequest;
    use orderly_core::workflow::{Workflow, Workflows};
    let store = ctx.store().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[1].timeout_ms += 5_000;
    let mut v3 = Workflow::default();
    v3.steps.truncate(2);
    for i in 0..3 {
        let o = crate::builders::order_with_id(&format!("m-{i}"), 1);
        store
            .submit(&o, &crate::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let a = owner("a");
    let claimed = store
        .claim(&ClaimRequest {
            owner: a.clone(),
            limit: 10,
            timeout: MINUTE,
            workflows: Arc::new(Workflows::new(vec![v1.clone()]).unwrap().filter()),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    // m-0 ends in Error, m-1 is handed back (Pending), m-2 stays in Processing.
    for c in &claimed {
        match c.fence.order_id.as_str() {
            "m-0" => store.fail(&c.fence, "declined", &[]).await.unwrap(),
            "m-1" => store.release(&c.fence, "handed back").await.unwrap(),
            _ => {}
        }
    }
    let op = Actor::operator("erin");
    let (r1, r2, r3) = (v1.reference(), v2.reference(), v3.reference());
    // Not stored yet: refused.
    let e = store
        .move_version(&r1, &r2, &[], &op, "budgets", 100)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("not stored"),
        "{e}"
    );
    store
        .record_workflows(
            &[
                Arc::new(v1.clone()),
                Arc::new(v2.clone()),
                Arc::new(v3.clone()),
            ],
            "test",
        )
        .await
        .unwrap();
    let e = store
        .move_version(&r1, &r3, &[], &op, "fewer steps", 100)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("not compatible") && e.to_string().contains("number of steps"),
        "{e}"
    );
    let e = store
        .move_version(&r1, &r2, &[ProcessState::Processing], &op, "budgets", 100)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Processing"), "{e}");
    for id in ["m-0", "m-1", "m-2"] {
        let s = row(&*store, &orderly_core::OrderId::parse(id).unwrap()).await;
        assert_eq!(
            s.workflow_version.as_deref(),
            Some(r1.version.as_str()),
            "{id}"
        );
    }
    // One at a time, then the rest: the Error and the Pending order move; the one in
    // Processing stays on v1.
    let first = store
        .move_version(&r1, &r2, &[], &op, "budgets", 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let rest = store
        .move_version(&r1, &r2, &[], &op, "budgets", 100)
        .await
        .unwrap();
    let mut moved: Vec<&str> = first.iter().chain(&rest).map(|o| o.as_str()).collect();
    moved.sort_unstable();
    assert_eq!(moved, ["m-0", "m-1"]);
    for (id, version, state) in [
        ("m-0", &r2.version, ProcessState::Error),
        ("m-1", &r2.version, ProcessState::Pending),
        ("m-2", &r1.version, ProcessState::Processing),
    ] {
        let view = store
            .get(&orderly_core::OrderId::parse(id).unwrap())
            .await
            .unwrap();
        assert_eq!(
            view.state.workflow_version.as_deref(),
            Some(version.as_str()),
            "{id}"
        );
        assert_eq!(view.state.process_state, state, "{id}");
        let moves: Vec<_> = view
            .history
            .iter()
            .filter(|e| e.kind == HistoryKind::VersionMoved)
            .collect();
        if id == "m-2" {
            assert!(moves.is_empty());
        } else {
            assert_eq!(moves.len(), 1, "{id}");
            assert_eq!(moves[0].actor.as_str(), "operator:erin");
            assert_eq!(
                (moves[0].from_state, moves[0].to_state),
                (Some(state), state)
            );
            let reason = moves[0].reason.as_deref().unwrap_or_default();
            assert!(
                reason.contains(&r1.to_string())
                    && reason.contains(&r2.to_string())
                    && reason.contains("budgets"),
                "{reason}"
            );
        }
    }
    // Nothing left to move.
    assert!(
        store
            .move_version(&r1, &r2, &[], &op, "budgets", 100)
            .await
            .unwrap()
            .is_empty()
    );
}

/// One message key per deployment: of racing first callers (each its own handle, like
/// the roles' processes starting together) one's fresh key is stored and all get that
/// one; a later caller gets it too, whatever fresh key it offers.
pub async fn the_message_key_is_created_once_and_shared(ctx: &Ctx) {
    use orderly_core::signing::MessageKey;
    let mut racers = Vec::new();
    let mut offered = Vec::new();
    for i in 0..6 {
        let store = ctx.store().await;
        let fresh = MessageKey::generate();
        offered.push(fresh.clone());
        racers.push(tokio::spawn(async move {
            store
                .message_key(fresh, &format!("agent-{i}"))
                .await
                .unwrap()
        }));
    }
    let mut keys = Vec::new();
    for r in racers {
        keys.push(r.await.unwrap());
    }
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "one key for all");
    assert!(
        offered.contains(&keys[0]),
        "the key is one a caller offered"
    );
    let later = ctx.store().await;
    assert_eq!(
        later
            .message_key(MessageKey::generate(), "scheduler-b")
            .await
            .unwrap(),
        keys[0]
    );
}
