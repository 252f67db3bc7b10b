//! The PostgreSQL state store: production and scale.
//!
//! Claims take rows with `FOR UPDATE SKIP LOCKED`, so concurrent schedulers never wait
//! for one another and never get the same row. The hot paths (claim, batched
//! completion, the supervisor's sweep) are one statement each, one round trip for a
//! whole batch, history included. Deadlines are compared on the server's clock
//! (`now()`, the transaction's start), unless a test injects its own.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::TimeSource;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::migrate;

mod sql {
    use crate::rows::{dead_letter_columns, message_columns};

    pub(super) const Q_ANY_READY: &str = "SELECT seq FROM queue_messages \
        WHERE queue = $1 AND visible_at <= coalesce($2::timestamptz, now()) ORDER BY visible_at, seq LIMIT 1";

    pub(super) const Q_CANDIDATES: &str = "SELECT seq, delivery_count FROM queue_messages \
        WHERE queue = $1 AND visible_at <= $2 ORDER BY visible_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED";

    /// `$1` seqs, `$2` lock token, `$3` locked until.
    pub(super) const Q_LOCK: &str = concat!(
        "UPDATE queue_messages SET delivery_count = delivery_count + 1, lock_token = $2, \
         locked_until = $3, visible_at = $3 WHERE seq = ANY($1::bigint[]) RETURNING ",
        message_columns!()
    );

    pub(super) const Q_DEAD_LETTER_EXHAUSTED: &str = concat!(
        "INSERT INTO queue_dead_letters (",
        dead_letter_columns!(),
        ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, delivery_count, \
         'MaxDeliveryCountExceeded', 'delivered ' || delivery_count || ' times without being completed', $2 \
         FROM queue_messages WHERE seq = ANY($1::bigint[])"
    );

    pub(super) const Q_DELETE_MANY: &str =
        "DELETE FROM queue_messages WHERE seq = ANY($1::bigint[])";

    /// `$1` relay, `$2` lease end, `$3` now, `$4` limit.
    pub(super) const O_LEASE: &str = "UPDATE outbox SET relay = $1, leased_until = $2, attempts = attempts + 1 \
        WHERE seq = ANY(ARRAY(SELECT seq FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL \
            AND (leased_until IS NULL OR leased_until <= $3) ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED)) \
        RETURNING seq, queue, message_id, correlation_id, properties, body, scheduled_at, attempts";

    /// `$1` seqs, `$2` relay, `$3` now, `$4` the reason.
    pub(super) const O_DEAD: &str = "UPDATE outbox SET dead_at = $3, dead_reason = $4, last_error = $4, \
        leased_until = NULL WHERE seq = ANY($1::bigint[]) AND relay = $2";

    /// `$1` seqs, `$2` relay, `$3` now.
    pub(super) const O_SENT: &str = "UPDATE outbox SET sent_at = $3, last_error = NULL \
        WHERE seq = ANY($1::bigint[]) AND relay = $2";

    /// `$1` seqs, `$2` relay, `$3` the error, `$4` not before.
    pub(super) const O_FAILED: &str = "UPDATE outbox SET last_error = $3, leased_until = $4 \
        WHERE seq = ANY($1::bigint[]) AND relay = $2";

    /// `$1` seqs and `$2` their lock tokens, pairwise; `$3` now.
    pub(super) const Q_COMPLETE_MANY: &str = "DELETE FROM queue_messages q \
        USING unnest($1::bigint[], $2::text[]) AS h(seq, token) \
        WHERE q.seq = h.seq AND q.lock_token = h.token AND q.locked_until > $3 RETURNING q.seq, q.lock_token";

    /// Records each id of `$2` as seen in queue `$1` until `$3` unless seen and not
    /// expired at `$4`; returns the ids that were not duplicates.
    pub(super) const Q_DEDUP_MANY: &str = "INSERT INTO queue_dedup (queue, message_id, expires_at) \
        SELECT $1, id, $3 FROM unnest($2::text[]) AS id \
        ON CONFLICT (queue, message_id) DO UPDATE SET expires_at = excluded.expires_at \
        WHERE queue_dedup.expires_at <= $4 RETURNING message_id";

    pub(super) const Q_INSERT_MANY: &str = "INSERT INTO queue_messages \
        (queue, message_id, correlation_id, properties, body, enqueued_at, visible_at) \
        SELECT $1, m.id, m.correlation, m.properties, m.body, $6, m.visible \
        FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $7::timestamptz[]) \
            AS m(id, correlation, properties, body, visible)";

    pub(super) const INSERT_ORDER: &str = "INSERT INTO orders (order_id, details, created_at) \
        VALUES ($1, $2::json, $3) ON CONFLICT (order_id) DO NOTHING";

    pub(super) const SELECT_DETAILS: &str = "SELECT details::text FROM orders WHERE order_id = $1";

    pub(super) const NOW: &str = "SELECT coalesce($1::timestamptz, now())";

    // The hot statements below select their rows with `= ANY(ARRAY(...))` (or an
    // id array) so every row of a batch is one primary-key probe: joined as a CTE
    // instead, the planner hash-joins the batch against a scan of the whole table.

    /// `$1` injected now or NULL, `$2` limit, `$3` owner, `$4` timeout in microseconds,
    /// `$5` the default workflow's name, `$6` JSON object of the workflows it starts
    /// (name to version), `$7` the `name@version`s it carries on. A new order is
    /// pinned here.
    pub(super) const CLAIM: &str = "WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now), \
        claimed AS ( \
            UPDATE order_state s SET process_state = 'Processing', locked_by = $3, \
                complete_by = clock.now + $4::bigint * interval '1 microsecond', \
                lock_epoch = s.lock_epoch + 1, updated_at = clock.now, \
                workflow = coalesce(s.workflow, $5), \
                workflow_version = coalesce(s.workflow_version, $6::text::jsonb ->> coalesce(s.workflow, $5)) \
            FROM clock \
            WHERE s.order_id = ANY(ARRAY( \
                    SELECT c.order_id FROM order_state c \
                    WHERE c.process_state = 'Pending' AND c.locked_by IS NULL \
                        AND c.next_attempt_at <= (SELECT now FROM clock) \
                        AND CASE WHEN c.workflow_version IS NULL \
                            THEN ($6::text::jsonb ->> coalesce(c.workflow, $5)) IS NOT NULL \
                            ELSE (c.workflow || '@' || c.workflow_version) = ANY($7::text[]) END \
                    ORDER BY c.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)) \
                AND s.process_state = 'Pending' \
            RETURNING s.order_id, s.lock_epoch, s.complete_by, s.current_step, s.failure_count, \
                s.reply_to, s.finish_as, s.generation, s.last_error, s.workflow, s.workflow_version, \
                clock.now AS at), \
        history AS ( \
            INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch) \
            SELECT order_id, at, $3, 'Claimed', 'Pending', 'Processing', lock_epoch FROM claimed) \
        SELECT c.order_id, c.lock_epoch, c.complete_by, c.current_step, c.failure_count, c.reply_to, \
            c.finish_as, c.generation, c.last_error, c.workflow, c.workflow_version, \
            (SELECT o.details::text FROM orders o WHERE o.order_id = c.order_id) AS details \
        FROM claimed c";

    /// `$1` injected now or NULL, `$2` order ids, `$3` owners, `$4` epochs.
    pub(super) const COMPLETE: &str = "WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now), \
        done AS ( \
            UPDATE order_state s SET process_state = 'Processed', locked_by = NULL, complete_by = NULL, \
                updated_at = clock.now \
            FROM clock, unnest($2::text[], $3::text[], $4::bigint[]) AS f(order_id, owner, epoch) \
            WHERE s.order_id = ANY($2::text[]) AND s.order_id = f.order_id \
                AND s.locked_by = f.owner AND s.lock_epoch = f.epoch \
                AND s.process_state = 'Processing' AND s.complete_by > clock.now \
            RETURNING s.order_id, s.lock_epoch, f.owner, clock.now AS at), \
        history AS ( \
            INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch) \
            SELECT order_id, at, owner, 'Completed', 'Processing', 'Processed', lock_epoch FROM done) \
        SELECT order_id FROM done";

    /// The fenced, step-guarded touch of many step writes at once: `$1` now, then per
    /// write order id, owner, epoch, expected step (-1: any), the step to move to (-1:
    /// none), whether a step failed and its error. Returns the orders touched.
    pub(super) const TOUCH_STEPS: &str = "UPDATE order_state s SET \
            current_step = CASE WHEN w.new_step > s.current_step THEN w.new_step ELSE s.current_step END, \
            last_error = CASE WHEN w.failed THEN w.err ELSE s.last_error END, \
            updated_at = $1 \
        FROM unnest($2::text[], $3::text[], $4::bigint[], $5::int[], $6::int[], $7::bool[], $8::text[]) \
            AS w(order_id, owner, epoch, expect, new_step, failed, err) \
        WHERE s.order_id = ANY($2::text[]) AND s.order_id = w.order_id \
            AND s.locked_by = w.owner AND s.lock_epoch = w.epoch \
            AND s.process_state = 'Processing' AND s.complete_by > $1 \
            AND (w.expect < 0 OR s.current_step = w.expect) \
        RETURNING s.order_id";

    /// Many step records at once: `$1` now, then per update order id, index, name,
    /// status, idempotency key, detail, epoch.
    pub(super) const UPSERT_STEPS: &str = "INSERT INTO order_steps \
            (order_id, step_index, name, status, idempotency_key, attempts, detail, epoch, updated_at) \
        SELECT u.order_id, u.idx, u.name, u.status, u.key, \
            CASE WHEN u.status = 'Started' THEN 1 ELSE 0 END, u.detail, u.epoch, $1 \
        FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[]) \
            AS u(order_id, idx, name, status, key, detail, epoch) \
        ON CONFLICT (order_id, step_index) DO UPDATE SET \
            name = excluded.name, status = excluded.status, \
            attempts = order_steps.attempts + excluded.attempts, detail = excluded.detail, \
            epoch = excluded.epoch, updated_at = excluded.updated_at";

    /// Many step history entries at once, in array order: `$1` now, then per update
    /// order id, actor, kind, epoch, step, reason.
    pub(super) const STEP_HISTORY: &str = "INSERT INTO order_history \
            (order_id, at, actor, kind, from_state, to_state, epoch, step, reason) \
        SELECT h.order_id, $1, h.actor, h.kind, 'Processing', 'Processing', h.epoch, h.step, h.reason \
        FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[]) \
            WITH ORDINALITY AS h(order_id, actor, kind, epoch, step, reason, n) \
        ORDER BY h.n";

    pub(super) const FIND_EXPIRED: &str = "SELECT order_id, locked_by, lock_epoch, complete_by, \
        failure_count FROM order_state \
        WHERE process_state = 'Processing' AND complete_by < coalesce($1::timestamptz, now()) \
        ORDER BY complete_by LIMIT $2";

    /// The expired orders of a sweep, locked (others' sweeps skip them): `$1` now,
    /// `$2` limit. What happens to each is decided in Rust (`RecoveryPolicy::decide`).
    pub(super) const LOCK_EXPIRED: &str = "SELECT s.order_id, s.locked_by, s.lock_epoch, \
            s.failure_count, s.current_step, s.finish_as, \
            EXISTS (SELECT 1 FROM order_steps t WHERE t.order_id = s.order_id \
                AND t.status IN ('Started', 'Succeeded')) AS has_effects \
        FROM order_state s \
        WHERE s.process_state = 'Processing' AND s.complete_by < $1 \
        ORDER BY s.complete_by LIMIT $2 FOR UPDATE OF s SKIP LOCKED";

    /// The decided recoveries, set-based: `$1` now, `$2` actor, then per order its id,
    /// epoch, failure count, new state, finish_as, next attempt (NULL: unchanged),
    /// reason and history kind.
    pub(super) const RECOVER: &str = "WITH recovered AS ( \
            UPDATE order_state s SET failure_count = d.failure_count, process_state = d.state, \
                finish_as = d.finish_as, next_attempt_at = coalesce(d.next_at, s.next_attempt_at), \
                last_error = d.reason, locked_by = NULL, complete_by = NULL, updated_at = $1 \
            FROM unnest($3::text[], $4::bigint[], $5::int[], $6::text[], $7::text[], \
                $8::timestamptz[], $9::text[], $10::text[]) \
                AS d(order_id, epoch, failure_count, state, finish_as, next_at, reason, kind) \
            WHERE s.order_id = ANY($3::text[]) AND s.order_id = d.order_id \
                AND s.process_state = 'Processing' AND s.lock_epoch = d.epoch AND s.complete_by < $1 \
            RETURNING s.order_id, d.state, d.reason, d.kind, s.lock_epoch), \
        history AS ( \
            INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch, reason) \
            SELECT order_id, $1, $2, kind, 'Processing', state, lock_epoch, reason FROM recovered) \
        SELECT order_id FROM recovered";
}

/// Connections per store unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The PostgreSQL state store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    time: TimeSource,
    wakeups: std::sync::Arc<crate::queue::Wakeups>,
    delivery: crate::Delivery,
}

/// The fallback poll interval of idle receivers (notifications are the fast path).
const POLL: Duration = Duration::from_secs(1);

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> orderly_core::Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| orderly_core::ValidationError::new("database_url", e.to_string()))?;
        Self::connect(options, DEFAULT_MAX_CONNECTIONS, time).await
    }

    /// Connects with explicit options (e.g. a `search_path` for an isolated schema) and
    /// applies pending migrations.
    pub async fn connect(
        options: PgConnectOptions,
        max_connections: u32,
        time: TimeSource,
    ) -> orderly_core::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(15))
            .connect_with(options.application_name("orderly"))
            .await
            .map_err(crate::error::db)?;
        let store = Self {
            pool,
            time,
            wakeups: std::sync::Arc::new(crate::queue::Wakeups::new(POLL)),
            delivery: crate::Delivery::Queue,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Sends the messages state changes cause to `delivery` from now on.
    pub fn with_delivery(mut self, delivery: crate::Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin_write(&self) -> orderly_core::Result<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(crate::error::db)
    }

    const MIGRATIONS: &'static [migrate::Migration] = migrate::POSTGRES;

    /// Start-ups of several instances at once migrate one after the other.
    async fn lock_migrations(&self, conn: &mut sqlx::PgConnection) -> orderly_core::Result<()> {
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.orderly_migrations'))",
        )
        .execute(conn)
        .await
        .map_err(crate::error::db)?;
        Ok(())
    }

    async fn tx_now(&self, conn: &mut sqlx::PgConnection) -> orderly_core::Result<DateTime<Utc>> {
        let now: Ts = sqlx::query_scalar(sql::NOW)
            .bind(self.now_param())
            .fetch_one(conn)
            .await
            .map_err(db)?;
        Ok(now.0)
    }

    fn now_param(&self) -> Option<Ts> {
        self.time.injected_now().map(Ts)
    }

    fn seqs_param(seqs: &[i64]) -> Vec<i64> {
        seqs.to_vec()
    }

    /// Inserts `rows` into `queue` unless (with `dedup_until`) their id was seen within
    /// the window; returns how many were inserted. Two statements for the whole batch.
    async fn insert_batch(
        &self,
        conn: &mut sqlx::PgConnection,
        now: Ts,
        queue: &orderly_core::transport::QueueName,
        dedup_until: Option<Ts>,
        rows: &[crate::queue::Row<'_>],
    ) -> Result<usize, sqlx::Error> {
        let mut ids: Vec<&str> = rows.iter().map(|r| r.message_id).collect();
        if let Some(until) = dedup_until {
            let fresh: Vec<String> = sqlx::query_scalar(sql::Q_DEDUP_MANY)
                .persistent(false)
                .bind(queue.as_str())
                .bind(&ids)
                .bind(until)
                .bind(now)
                .fetch_all(&mut *conn)
                .await?;
            let fresh: std::collections::HashSet<String> = fresh.into_iter().collect();
            ids.retain(|id| fresh.contains(*id));
        }
        let keep: Vec<&crate::queue::Row<'_>> = rows
            .iter()
            .filter(|r| ids.contains(&r.message_id))
            .collect();
        if keep.is_empty() {
            return Ok(0);
        }
        let correlations: Vec<Option<&str>> = keep.iter().map(|r| r.correlation_id).collect();
        let properties: Vec<&str> = keep.iter().map(|r| r.properties.as_str()).collect();
        let bodies: Vec<&[u8]> = keep.iter().map(|r| r.body).collect();
        let visible: Vec<chrono::DateTime<chrono::Utc>> =
            keep.iter().map(|r| r.visible_at.0).collect();
        let ids: Vec<&str> = keep.iter().map(|r| r.message_id).collect();
        sqlx::query(sql::Q_INSERT_MANY)
            .persistent(false)
            .bind(queue.as_str())
            .bind(&ids)
            .bind(&correlations)
            .bind(&properties)
            .bind(&bodies)
            .bind(now)
            .bind(&visible)
            .execute(&mut *conn)
            .await?;
        Ok(keep.len())
    }

    /// The holds of `messages` as two parallel arrays: seqs and lock tokens.
    fn holds_params(
        messages: &[orderly_core::transport::ReceivedMessage],
    ) -> (Vec<i64>, Vec<String>) {
        (
            messages.iter().map(|m| m.sequence_number).collect(),
            messages.iter().map(|m| m.lock_token.0.clone()).collect(),
        )
    }

    /// `NOTIFY` inside the sending transaction: delivered to listeners at commit.
    async fn notify_sent(
        &self,
        conn: &mut sqlx::PgConnection,
        queue: &orderly_core::transport::QueueName,
    ) -> Result<(), orderly_core::transport::TransportError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(crate::queue::CHANNEL)
            .bind(queue.as_str())
            .execute(conn)
            .await
            .map_err(|e| orderly_core::transport::TransportError::Unavailable(Box::new(e)))?;
        Ok(())
    }

    /// Starts, once, a task that `LISTEN`s for sends from any process and wakes this
    /// store's receivers. It holds one connection of the pool. If the listener cannot
    /// connect (e.g. behind a transaction-pooling proxy) receivers still poll.
    fn start_listening(&self) {
        use std::sync::atomic::Ordering;
        if self.wakeups.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = self.pool.clone();
        let wakeups = std::sync::Arc::downgrade(&self.wakeups);
        tokio::spawn(async move {
            loop {
                match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut listener) => match listener.listen(crate::queue::CHANNEL).await {
                        Ok(()) => loop {
                            match listener.recv().await {
                                Ok(n) => match wakeups.upgrade() {
                                    Some(w) => w.wake(n.payload()),
                                    None => return,
                                },
                                Err(e) => {
                                    tracing::warn!(error = %e, "queue listener lost its connection; polling until it is back");
                                    break;
                                }
                            }
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot LISTEN for queue sends; polling instead")
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot connect the queue listener; polling instead")
                    }
                }
                match wakeups.upgrade() {
                    Some(w) => w.wake_all(),
                    None => return,
                }
                tokio::time::sleep(POLL).await;
            }
        });
    }

    async fn claim_batch(
        &self,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let rows = sqlx::query(sql::CLAIM)
            .bind(self.now_param())
            .bind(i64::from(request.limit))
            .bind(request.owner.as_str())
            .bind(timeout_micros)
            .bind(&request.workflows.default_name)
            .bind(crate::statements::start_json(&request.workflows)?)
            .bind(crate::statements::carry_on(&request.workflows))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        Self::claimed_orders(&rows, request)
    }

    /// Claims inside `tx` (with the claims' history); the caller commits.
    async fn claim_in(
        tx: &mut WriteTxn,
        request: &ClaimRequest,
        timeout_micros: i64,
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimedOrder>> {
        let rows = sqlx::query(sql::CLAIM)
            .bind(Some(Ts(now)))
            .bind(i64::from(request.limit))
            .bind(request.owner.as_str())
            .bind(timeout_micros)
            .bind(&request.workflows.default_name)
            .bind(crate::statements::start_json(&request.workflows)?)
            .bind(crate::statements::carry_on(&request.workflows))
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
        Self::claimed_orders(&rows, request)
    }

    fn claimed_orders(
        rows: &[sqlx::postgres::PgRow],
        request: &ClaimRequest,
    ) -> Result<Vec<ClaimedOrder>> {
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                Ok(ClaimedOrder {
                    fence: Fence {
                        order_id: c.order_id("order_id")?,
                        owner: request.owner.clone(),
                        epoch: orderly_core::Epoch(c.get("lock_epoch")?),
                    },
                    complete_by: c.ts("complete_by")?,
                    current_step: c.get("current_step")?,
                    failure_count: c.get("failure_count")?,
                    details: OrderDetails::from_json(&c.get::<String>("details")?)
                        .map_err(|e| corrupt("orders.details", e))?,
                    reply_to: c.get("reply_to")?,
                    finish_as: c.opt_state("finish_as")?,
                    generation: c.get("generation")?,
                    last_error: c.get("last_error")?,
                    workflow: c.workflow_ref()?,
                })
            })
            .collect()
    }

    async fn complete_batch(&self, completions: &[Completion]) -> Result<BatchOutcome> {
        let fences: Vec<&Fence> = completions.iter().map(|c| &c.fence).collect();
        let ids: Vec<&str> = fences.iter().map(|f| f.order_id.as_str()).collect();
        let owners: Vec<&str> = fences.iter().map(|f| f.owner.as_str()).collect();
        let epochs: Vec<i64> = fences.iter().map(|f| f.epoch.0).collect();
        // Unnamed (not cached) so the server plans it for this batch's actual arrays; a
        // cached generic plan cannot see their size and picks a far slower join.
        let query = sqlx::query_scalar(sql::COMPLETE)
            .persistent(false)
            .bind(self.now_param())
            .bind(&ids)
            .bind(&owners)
            .bind(&epochs);
        let done: std::collections::HashSet<String> =
            if completions.iter().all(|c| c.sends.is_empty()) {
                // One statement, one round trip: nothing else to commit with it.
                query
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?
                    .into_iter()
                    .collect()
            } else {
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let done: std::collections::HashSet<String> = query
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db)?
                    .into_iter()
                    .collect();
                // Only completed orders' messages are sent.
                let sends: Vec<Envelope> = completions
                    .iter()
                    .filter(|c| done.contains(c.fence.order_id.as_str()))
                    .flat_map(|c| c.sends.iter().cloned())
                    .collect();
                self.commit_with(tx, now, &sends).await?;
                done
            };
        let (completed, refused): (Vec<&Fence>, Vec<&Fence>) = fences
            .iter()
            .partition(|f| done.contains(f.order_id.as_str()));
        let mut outcome = BatchOutcome {
            completed: completed.iter().map(|f| f.order_id.clone()).collect(),
            refused: Vec::with_capacity(refused.len()),
        };
        if !refused.is_empty() {
            let mut conn = self.pool.acquire().await.map_err(db)?;
            let now = self.tx_now(&mut conn).await?;
            for fence in refused {
                let why = Self::explain(&mut conn, fence, now, ProcessState::Processed).await;
                outcome.refused.push((fence.order_id.clone(), why));
            }
        }
        Ok(outcome)
    }

    async fn recover_batch(
        &self,
        leader: &orderly_core::leader::LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<Recovered>> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        Self::check_leader(&mut tx, leader, now).await?;
        let rows = sqlx::query(sql::LOCK_EXPIRED)
            .bind(Ts(now))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let mut decided = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let expired = c.expired()?;
            let epoch: i64 = c.get("lock_epoch")?;
            decided.push((
                expired.order_id.clone(),
                epoch,
                policy.decide(&expired, now),
            ));
        }
        if decided.is_empty() {
            tx.commit().await.map_err(db)?;
            return Ok(Vec::new());
        }
        let applied: Vec<String> = sqlx::query_scalar(sql::RECOVER)
            .bind(Ts(now))
            .bind(leader.holder.as_str())
            .bind(
                decided
                    .iter()
                    .map(|(id, ..)| id.as_str().to_owned())
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(_, epoch, _)| *epoch)
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.failure_count)
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.to.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.finish_as.map(|s| s.as_str()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.next_attempt_at)
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.reason.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                decided
                    .iter()
                    .map(|(.., d)| d.kind.as_str())
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        // Only what the update applied (all of them: the rows are locked) is reported.
        let applied: std::collections::HashSet<String> = applied.into_iter().collect();
        Ok(decided
            .into_iter()
            .filter(|(id, ..)| applied.contains(id.as_str()))
            .map(|(.., d)| d.outcome)
            .collect())
    }
}

/// The write transaction of this dialect, for the shared operations.
type WriteTxn = Transaction<'static, Postgres>;

impl PgStore {
    /// Completes the orders of `fences` inside `tx` (with their history); returns the
    /// ids it completed.
    async fn complete_in(
        tx: &mut WriteTxn,
        fences: &[&Fence],
        now: DateTime<Utc>,
    ) -> Result<std::collections::HashSet<String>> {
        let ids: Vec<&str> = fences.iter().map(|f| f.order_id.as_str()).collect();
        let owners: Vec<&str> = fences.iter().map(|f| f.owner.as_str()).collect();
        let epochs: Vec<i64> = fences.iter().map(|f| f.epoch.0).collect();
        let done: Vec<String> = sqlx::query_scalar(sql::COMPLETE)
            .persistent(false)
            .bind(Some(Ts(now)))
            .bind(&ids)
            .bind(&owners)
            .bind(&epochs)
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
        Ok(done.into_iter().collect())
    }

    /// The writes of a `record_steps` batch as three set-based statements (a touch,
    /// the step records, the history) instead of three round trips per update. A
    /// write whose order already has a write in the batch, or that names one step
    /// twice, is applied on its own after the others, in order; refused writes are
    /// explained one by one. `Some(refusal)` for each refused write.
    async fn apply_step_writes(
        &self,
        tx: &mut WriteTxn,
        writes: &[orderly_core::store::StepWrite],
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<orderly_core::Error>>> {
        use orderly_core::StepStatus;
        use orderly_core::history::HistoryKind;

        let mut seen = std::collections::HashSet::new();
        let (bulk, alone): (Vec<usize>, Vec<usize>) = (0..writes.len()).partition(|&i| {
            let w = &writes[i];
            let mut steps = std::collections::HashSet::new();
            !w.updates.is_empty()
                && w.updates.iter().all(|u| steps.insert(u.index))
                && seen.insert(w.fence.order_id.as_str())
        });
        let mut refusals: Vec<Option<orderly_core::Error>> = writes.iter().map(|_| None).collect();
        if !bulk.is_empty() {
            let mut t = TouchArrays::default();
            for &i in &bulk {
                let w = &writes[i];
                t.ids.push(w.fence.order_id.as_str());
                t.owners.push(w.fence.owner.as_str());
                t.epochs.push(w.fence.epoch.0);
                t.expects.push(w.expect_step.unwrap_or(-1));
                let new_step = w
                    .updates
                    .iter()
                    .filter(|u| u.status == StepStatus::Succeeded)
                    .map(|u| u.index + 1)
                    .max()
                    .unwrap_or(-1);
                t.new_steps.push(new_step);
                let failed = w
                    .updates
                    .iter()
                    .rev()
                    .find(|u| u.status == StepStatus::Failed);
                t.failed.push(failed.is_some());
                t.errors.push(
                    failed
                        .and_then(|u| u.detail.as_deref())
                        .map(|d| orderly_core::store::bounded_text(d).to_owned()),
                );
            }
            let touched: std::collections::HashSet<String> = sqlx::query_scalar(sql::TOUCH_STEPS)
                .persistent(false)
                .bind(Ts(now))
                .bind(&t.ids)
                .bind(&t.owners)
                .bind(&t.epochs)
                .bind(&t.expects)
                .bind(&t.new_steps)
                .bind(&t.failed)
                .bind(&t.errors)
                .fetch_all(&mut **tx)
                .await
                .map_err(crate::error::db)?
                .into_iter()
                .collect();
            let mut u = UpdateArrays::default();
            for &i in &bulk {
                let w = &writes[i];
                if !touched.contains(w.fence.order_id.as_str()) {
                    continue;
                }
                for step in &w.updates {
                    let detail = step
                        .detail
                        .as_deref()
                        .map(|d| orderly_core::store::bounded_text(d).to_owned());
                    u.ids.push(w.fence.order_id.as_str().to_owned());
                    u.indexes.push(step.index);
                    u.names.push(step.name.clone());
                    u.statuses.push(step.status.as_str().to_owned());
                    u.keys.push(step.idempotency_key.clone());
                    u.details.push(detail);
                    u.epochs.push(w.fence.epoch.0);
                    u.actors.push(w.fence.owner.as_str().to_owned());
                    u.kinds.push(
                        match step.status {
                            StepStatus::Started => HistoryKind::StepStarted,
                            StepStatus::Succeeded => HistoryKind::StepSucceeded,
                            StepStatus::Failed => HistoryKind::StepFailed,
                            StepStatus::Compensated => HistoryKind::StepCompensated,
                        }
                        .as_str()
                        .to_owned(),
                    );
                }
            }
            if !u.ids.is_empty() {
                sqlx::query(sql::UPSERT_STEPS)
                    .persistent(false)
                    .bind(Ts(now))
                    .bind(&u.ids)
                    .bind(&u.indexes)
                    .bind(&u.names)
                    .bind(&u.statuses)
                    .bind(&u.keys)
                    .bind(&u.details)
                    .bind(&u.epochs)
                    .execute(&mut **tx)
                    .await
                    .map_err(crate::error::db)?;
                sqlx::query(sql::STEP_HISTORY)
                    .persistent(false)
                    .bind(Ts(now))
                    .bind(&u.ids)
                    .bind(&u.actors)
                    .bind(&u.kinds)
                    .bind(&u.epochs)
                    .bind(&u.indexes)
                    .bind(&u.details)
                    .execute(&mut **tx)
                    .await
                    .map_err(crate::error::db)?;
            }
            for &i in &bulk {
                let w = &writes[i];
                if !touched.contains(w.fence.order_id.as_str()) {
                    refusals[i] = Some(Self::explain_step(tx, &w.fence, now, w.expect_step).await);
                }
            }
        }
        for i in alone {
            refusals[i] = Self::apply_step_write(tx, &writes[i], now).await?;
        }
        Ok(refusals)
    }
}

#[derive(Default)]
struct TouchArrays<'a> {
    ids: Vec<&'a str>,
    owners: Vec<&'a str>,
    epochs: Vec<i64>,
    expects: Vec<i32>,
    new_steps: Vec<i32>,
    failed: Vec<bool>,
    errors: Vec<Option<String>>,
}

#[derive(Default)]
struct UpdateArrays {
    ids: Vec<String>,
    indexes: Vec<i32>,
    names: Vec<String>,
    statuses: Vec<String>,
    keys: Vec<String>,
    details: Vec<Option<String>>,
    epochs: Vec<i64>,
    actors: Vec<String>,
    kinds: Vec<String>,
}

crate::shared::store_ops!(PgStore, Postgres);
crate::queue::queue_ops!(PgStore, Postgres);
crate::outbox::outbox_ops!(PgStore, Postgres);
