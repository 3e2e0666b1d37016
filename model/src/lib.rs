//! The data every stage shares, and nothing else: request and step records, process identity,
//! clocks and the agent's counters, every threshold, the one median and percentile. A crate of
//! its own, importing no other inferscope crate but `inferscope-common` (the kernel's counter ids), so the decoders and every stage of the agent can
//! name these types without importing each other (`docs/src/architecture.md`).
pub mod clock;
pub mod counters;
pub mod disagg;
pub mod identity;
pub mod launch;
pub mod lifecycle;
pub mod metric_names;
pub mod quantile;
pub mod record;
pub mod thresholds;

pub use counters::{Counter, Kind as CounterKind, Stats};
pub use disagg::{
    DisaggHints, DisaggInfo, DisaggLeg, DisaggRole, HandoffParams, HandoffValue, LegParse,
};
pub use identity::ProcessIdentity;
pub use launch::{GraphKernels, LaunchRecord, LaunchSources, NamedCount, StepLaunches};
pub use lifecycle::PerProcess;
pub use record::{EndedBy, Http2Info, RequestRecord, StepMember, StepRecord, StepRef};
