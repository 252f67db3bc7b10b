//! The domain of orderly: order ids and validated order details, the state row with
//! its `ProcessState` machine, per-step records, the append-only history, the `Clock`,
//! and the ports (traits) the roles use to reach the state store.
//!
//! This crate owns the rules; it must not depend on a database driver, a queue client
//! or any Azure crate. Adapters (`orderly-sql`, later Azure) implement its ports.

pub mod activity;
pub mod clock;
pub mod conditions;
pub mod credentials;
pub mod duration;
pub mod error;
pub mod history;
pub mod id;
pub mod leader;
pub mod messages;
pub mod order;
pub mod service;
pub mod signing;
pub mod state;
pub mod step;
pub mod store;
pub mod tracecontext;
pub mod transport;
pub mod triage;
pub mod validation;
pub mod workflow;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock, TimeSource};
pub use error::{Error, Result, ValidationError};
pub use history::{HistoryEvent, HistoryKind};
pub use id::{Actor, InstanceId, OrderId};
pub use order::{Currency, OrderDetails, OrderLine};
pub use state::{Epoch, Fence, ProcessState, StateRow};
pub use step::{RetryPlan, StepRecord, StepStatus};
