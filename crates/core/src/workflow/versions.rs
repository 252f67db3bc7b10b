//! Which version an order runs on: the `name@version` an order is pinned to, and
//! the set of versions a scheduler has loaded.

use super::{Workflow, check_workflow_name};
use crate::state::ProcessState;
use crate::transport::QueueName;
use crate::validation::ValidationError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

impl crate::state::StateRow {
    /// The workflow it runs, for operators: `name@version` once started, the name it
    /// asked for before (`(default)` if none).
    pub fn workflow_label(&self) -> String {
        row_label(self.workflow.as_deref(), self.workflow_version.as_deref())
    }
}

/// An order's workflow as its row has it, for operators: `name@version` once started,
/// the name it asked for before (`(default)` if none), saying the version is not chosen.
pub fn row_label(name: Option<&str>, version: Option<&str>) -> String {
    let label = label(name, version);
    match version {
        Some(_) => label,
        None => format!("{label} (version chosen when a scheduler starts it)"),
    }
}

/// How operators see an order's workflow: `name@version` once pinned, the name alone
/// before; `(default)` for an order that named none.
pub fn label(name: Option<&str>, version: Option<&str>) -> String {
    let name = name.unwrap_or("(default)");
    match version {
        Some(v) => format!("{name}@{v}"),
        None => name.to_owned(),
    }
}

/// The workflow version an order is pinned to: `name@version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkflowRef {
    /// The workflow's name.
    pub name: String,
    /// Its version ([`Workflow::version`]).
    pub version: String,
}

impl WorkflowRef {
    /// Parses `name@version`.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let (name, version) = text.split_once('@').ok_or_else(|| {
            ValidationError::new("workflow", format!("{text:?} is not name@version"))
        })?;
        check_workflow_name("workflow", name)?;
        if version.is_empty()
            || version.len() > 64
            || !version.chars().all(|c| c.is_ascii_hexdigit())
        {
            return Err(ValidationError::new(
                "workflow",
                format!("{text:?}: the version must be hex digits"),
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            version: version.to_owned(),
        })
    }
}

impl fmt::Display for WorkflowRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

impl TryFrom<String> for WorkflowRef {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<WorkflowRef> for String {
    fn from(r: WorkflowRef) -> Self {
        r.to_string()
    }
}

/// The workflows one scheduler runs: for each name, the version it starts new orders
/// on, and every version it can carry on (kept so orders started under an earlier
/// definition finish on it). The first workflow loaded is the default, for orders
/// that name none.
#[derive(Debug, Clone)]
pub struct Workflows {
    default: Arc<Workflow>,
    current: BTreeMap<String, Arc<Workflow>>,
    known: BTreeMap<WorkflowRef, Arc<Workflow>>,
}

impl Workflows {
    /// The catalogue of `workflows`, each validated: the first is the default; for a
    /// name given more than once, the first is the one new orders start on and the
    /// others only finish the orders pinned to them.
    pub fn new(workflows: Vec<Workflow>) -> Result<Self, ValidationError> {
        let mut current = BTreeMap::new();
        let mut known = BTreeMap::new();
        let mut default = None;
        for w in workflows {
            w.validate()?;
            let w = Arc::new(w);
            default.get_or_insert_with(|| w.clone());
            current.entry(w.name.clone()).or_insert_with(|| w.clone());
            known.entry(w.reference()).or_insert(w);
        }
        let default =
            default.ok_or_else(|| ValidationError::new("workflow", "no workflow given"))?;
        Ok(Self {
            default,
            current,
            known,
        })
    }

    /// This catalogue, also carrying on `stored` versions it does not have (read from
    /// the store): orders pinned to them run here, and new orders of a workflow it was
    /// given start on the version it was given.
    ///
    /// A workflow it was given no file for at all starts new orders that ask for it on
    /// its most recent stored version (`stored` comes oldest first): an operator who
    /// declared it with `orderly migrate --workflow` needs no scheduler restarted.
    pub fn with_stored(&self, stored: impl IntoIterator<Item = Workflow>) -> Self {
        let mut out = self.clone();
        for w in stored {
            let w = Arc::new(w);
            if !self.current.contains_key(&w.name) {
                out.current.insert(w.name.clone(), w.clone());
            }
            out.known.entry(w.reference()).or_insert(w);
        }
        out
    }

    /// The versions it was given or added, as definitions to store.
    pub fn definitions(&self) -> Vec<Arc<Workflow>> {
        self.known.values().cloned().collect()
    }

    /// A catalogue of one workflow.
    pub fn single(workflow: Workflow) -> Result<Self, ValidationError> {
        Self::new(vec![workflow])
    }

    /// The workflow for orders that name none.
    pub fn default_workflow(&self) -> &Arc<Workflow> {
        &self.default
    }

    /// The workflow an order pinned to `reference` runs, if this catalogue has it;
    /// `None` for the reference means an order from before workflows were pinned,
    /// which runs the default.
    pub fn get(&self, reference: Option<&WorkflowRef>) -> Option<&Arc<Workflow>> {
        match reference {
            None => Some(&self.default),
            Some(r) => self.known.get(r),
        }
    }

    /// Every version it can carry on.
    pub fn references(&self) -> impl Iterator<Item = &WorkflowRef> {
        self.known.keys()
    }

    /// Every agent queue any of its workflows uses, once each.
    pub fn queues(&self) -> Vec<QueueName> {
        let mut queues: Vec<QueueName> = self.known.values().flat_map(|w| w.queues()).collect();
        queues.sort();
        queues.dedup();
        queues
    }

    /// The longest total budget of its workflows: a processing timeout that suits all.
    pub fn total_budget(&self) -> Duration {
        self.known
            .values()
            .map(|w| w.total_budget())
            .max()
            .unwrap_or_default()
    }

    /// Which orders a scheduler with this catalogue may claim, and what it pins them to.
    pub fn filter(&self) -> WorkflowFilter {
        WorkflowFilter {
            default_name: self.default.name.clone(),
            start: self
                .current
                .iter()
                .map(|(name, w)| (name.clone(), w.version()))
                .collect(),
            carry_on: self.known.keys().cloned().collect(),
        }
    }

    /// Whether it serves an order of workflow `name` (`None`: the default) pinned to
    /// `version` (`None`: not started yet).
    pub fn serves(&self, name: Option<&str>, version: Option<&str>) -> bool {
        let name = name.unwrap_or(&self.default.name);
        match version {
            None => self.current.contains_key(name),
            Some(v) => self.known.keys().any(|r| r.name == name && r.version == v),
        }
    }
}

impl Default for Workflows {
    /// The catalogue of the default workflow alone.
    fn default() -> Self {
        let w = Arc::new(Workflow::default());
        Self {
            current: BTreeMap::from([(w.name.clone(), w.clone())]),
            known: BTreeMap::from([(w.reference(), w.clone())]),
            default: w,
        }
    }
}

/// What a claim may take: orders not started yet whose workflow (or the default, for
/// orders that name none) it starts, pinning them to that version, and started orders
/// pinned to a version it carries on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowFilter {
    /// The workflow of orders that name none.
    pub default_name: String,
    /// For each name it starts, the version it pins new orders to.
    pub start: BTreeMap<String, String>,
    /// The versions it carries on.
    pub carry_on: Vec<WorkflowRef>,
}

impl Default for WorkflowFilter {
    /// The filter of the default workflow alone.
    fn default() -> Self {
        Workflows::default().filter()
    }
}

/// A workflow version as the store keeps it: its definition (JSON), written the first
/// time the version was used, never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorkflow {
    /// Which version.
    pub reference: crate::workflow::WorkflowRef,
    /// The definition, as [`crate::workflow::Workflow::to_stored`] writes it.
    pub definition: String,
    /// When it was first stored.
    pub first_seen_at: DateTime<Utc>,
    /// Who stored it (a scheduler's instance id, or `operator:...` for `orderly migrate`).
    pub first_seen_by: String,
}

impl StoredWorkflow {
    /// The workflow it defines, checked: valid, and of the version it is stored as.
    pub fn workflow(&self) -> Result<crate::workflow::Workflow, ValidationError> {
        crate::workflow::Workflow::from_stored(&self.definition, &self.reference)
    }
}

/// Live orders of one workflow version in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowCount {
    /// The workflow asked for (`None`: the schedulers' default).
    pub workflow: Option<String>,
    /// The version pinned (`None`: not started yet).
    pub version: Option<String>,
    /// Pending or Processing.
    pub state: ProcessState,
    /// How many orders.
    pub orders: i64,
}

impl WorkflowCount {
    /// `name@version`, or the name alone before the orders started.
    pub fn label(&self) -> String {
        crate::workflow::label(self.workflow.as_deref(), self.version.as_deref())
    }
}
