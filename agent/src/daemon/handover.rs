//! Handing a node from one agent to the next during a surge roll (a DaemonSet with
//! `maxSurge: 1, maxUnavailable: 0`): the new agent starts while the old one still runs, both
//! see every request for a while, and each request must be recorded by exactly one of them.
//!
//! The split is one instant, the cut, on the clock both agents' kernel events carry
//! (CLOCK_MONOTONIC, one per node): a request whose first bytes the server read before the cut
//! is the old agent's, any later one the new agent's. The two agree through two small files in
//! the directory they share (the agent's socket directory, a hostPath):
//!
//! 1. The new agent finds the old one's socket live: it writes `successor.pid`, attaches and
//!    runs, but records nothing yet: a request that ends while no cut is written was read before
//!    any cut the old agent can still write (step 2), so it is the old agent's.
//! 2. On SIGTERM, the old agent finds a live successor, picks the cut a little ahead of now
//!    ([`CUT_LEAD`], so that a successor that read "no cut yet" a moment ago is still right),
//!    writes it to `handover.cut`, keeps recording requests read before it until they end (up to
//!    its drain time), and counts later ones as handed over.
//! 3. The new agent reads the cut, records requests read from it on, and takes the sockets over
//!    once the old agent has exited.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use inferscope_model::{Counter, RequestRecord, StepRecord, clock::monotonic_now_ns};

/// How far ahead of its SIGTERM the old agent puts the cut: more than the time it takes to
/// write the file, so "no cut written yet" always means "the cut, when written, is later".
pub(crate) const CUT_LEAD: Duration = Duration::from_secs(1);

/// How often a successor in standby looks for the cut file (not once per record: at thousands
/// of requests a second that was a file read each). Safe while well under [`CUT_LEAD`]: a
/// request read at or after the cut ends, and is gated, at least `CUT_LEAD` after the file was
/// written, by which time a look has found it.
const CUT_REREAD: Duration = Duration::from_millis(100);

const SUCCESSOR_FILE: &str = "successor.pid";
const CUT_FILE: &str = "handover.cut";

/// The two files, in the directory the agents share.
#[derive(Debug, Clone)]
pub(crate) struct HandoverDir {
    dir: PathBuf,
}

impl HandoverDir {
    pub(crate) fn new(dir: &Path) -> Self {
        Self { dir: dir.into() }
    }

    /// Writes `contents` beside `name`, then renames it over: readers see all of it or none.
    fn write(&self, name: &str, contents: &str) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))
    }

    /// The new agent says it is here (step 1).
    pub(crate) fn announce_successor(&self) -> std::io::Result<()> {
        self.write(SUCCESSOR_FILE, &format!("{}\n", std::process::id()))
    }

    /// A successor that announced itself and still runs (not this process).
    pub(crate) fn live_successor(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join(SUCCESSOR_FILE)).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        let pid_t = libc::pid_t::try_from(pid).ok()?;
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        (alive && pid != std::process::id()).then_some(pid)
    }

    /// The old agent's cut (step 2): now plus [`CUT_LEAD`], written before it is returned.
    pub(crate) fn write_cut(&self) -> std::io::Result<u64> {
        let lead = u64::try_from(CUT_LEAD.as_nanos()).unwrap_or(u64::MAX);
        let cut = monotonic_now_ns().saturating_add(lead);
        self.write(CUT_FILE, &format!("{cut}\n"))?;
        Ok(cut)
    }

    pub(crate) fn read_cut(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(CUT_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Both files gone: after a takeover, or at the start of an agent alone on the node.
    pub(crate) fn clear(&self) {
        let _ = std::fs::remove_file(self.dir.join(SUCCESSOR_FILE));
        let _ = std::fs::remove_file(self.dir.join(CUT_FILE));
    }
}

/// Which requests this agent records.
#[derive(Debug)]
enum Role {
    /// The only agent on the node: every request, until a SIGTERM with a successor sets a cut.
    Sole,
    /// Started beside a running agent: requests read from the cut on, once the cut is known.
    Successor { cut: Option<u64> },
}

/// Decides, per record, whether this agent records it; counts what it leaves to the other.
#[derive(Debug)]
pub(crate) struct Gate {
    role: Role,
    dir: Option<HandoverDir>,
    /// The cut this (old) agent wrote on SIGTERM; 0 while none.
    retire_cut: Arc<AtomicU64>,
    handed_over: u64,
    left_to_previous: u64,
    /// A successor's loss counters as they stood when the cut passed: what it counted before
    /// concerns requests read before the cut, which the previous agent records or counts.
    losses_at_cut: Option<std::collections::HashMap<Counter, u64>>,
    /// When a successor last looked for the cut file (see [`CUT_REREAD`]).
    cut_looked: Option<std::time::Instant>,
}

impl Gate {
    /// An agent alone on the node.
    pub(crate) fn sole() -> Self {
        Self {
            role: Role::Sole,
            dir: None,
            retire_cut: Arc::new(AtomicU64::new(0)),
            handed_over: 0,
            left_to_previous: 0,
            losses_at_cut: None,
            cut_looked: None,
        }
    }

    /// An agent started beside a running one that shares `dir`.
    pub(crate) fn successor(dir: HandoverDir) -> Self {
        Self {
            role: Role::Successor { cut: None },
            dir: Some(dir),
            ..Self::sole()
        }
    }

    /// Where the drain sets the cut it wrote (see [`Drain`]).
    pub(crate) fn retire_cut(&self) -> Arc<AtomicU64> {
        self.retire_cut.clone()
    }

    pub(crate) fn is_standby(&self) -> bool {
        matches!(self.role, Role::Successor { .. })
    }

    /// The previous agent has exited: from now on this agent is alone. Without a cut read
    /// (the previous agent died without one), requests read from now on are this agent's.
    pub(crate) fn took_over(&mut self) -> u64 {
        let cut = match self.role {
            Role::Successor { cut: Some(cut) } => cut,
            _ => self.cut_from_file().unwrap_or_else(monotonic_now_ns),
        };
        self.role = Role::Successor { cut: Some(cut) };
        cut
    }

    fn cut_from_file(&self) -> Option<u64> {
        self.dir.as_ref().and_then(HandoverDir::read_cut)
    }

    /// The cut this agent goes by as a successor, read from the file while unknown.
    fn successor_cut(&mut self) -> Option<u64> {
        if let Role::Successor { cut: None } = self.role
            && self
                .cut_looked
                .is_none_or(|looked| looked.elapsed() >= CUT_REREAD)
        {
            self.cut_looked = Some(std::time::Instant::now());
            let read = self.cut_from_file();
            self.role = Role::Successor { cut: read };
        }
        match self.role {
            Role::Successor { cut } => cut,
            Role::Sole => None,
        }
    }

    /// Whether a request whose first bytes were read at `read_ns` is this agent's to record.
    fn owns(&mut self, read_ns: u64) -> Ownership {
        let retire = self.retire_cut.load(Ordering::Acquire);
        if retire != 0 && read_ns >= retire {
            return Ownership::HandedOver;
        }
        match self.role {
            Role::Sole => Ownership::Ours,
            Role::Successor { .. } => match self.successor_cut() {
                Some(cut) if read_ns >= cut => Ownership::Ours,
                // Read before the cut, or ended while no cut was written (then read before any
                // cut the previous agent can still write): the previous agent records it.
                _ => Ownership::Previous,
            },
        }
    }

    pub(crate) fn admits(&mut self, record: &RequestRecord) -> bool {
        match self.owns(record.arrival_read_mono_ns) {
            Ownership::Ours => true,
            Ownership::HandedOver => {
                self.handed_over += 1;
                false
            }
            Ownership::Previous => {
                self.left_to_previous += 1;
                false
            }
        }
    }

    /// Engine steps split the same way, by their start (not counted: steps are not requests).
    pub(crate) fn admits_step(&mut self, step: &StepRecord) -> bool {
        self.owns(step.start_mono_ns) == Ownership::Ours
    }

    /// A successor's loss counters count from the cut on (before it, zero): a loss counted
    /// before the cut (a request joined mid-way on a connection open before this agent
    /// attached, say) is about a request read before the cut, the previous agent's to record
    /// or count. A loss counted after the cut about a request read before it is still counted
    /// here (rare: one still open at the cut that the previous agent records too).
    pub(crate) fn adjust_losses(&mut self, counters: &mut [(Counter, u64)]) {
        let Role::Successor { .. } = self.role else {
            return;
        };
        if self.losses_at_cut.is_none()
            && self
                .successor_cut()
                .is_some_and(|cut| monotonic_now_ns() >= cut)
        {
            self.losses_at_cut = Some(
                counters
                    .iter()
                    .filter(|(c, _)| c.kind() == inferscope_model::counters::Kind::Loss)
                    .copied()
                    .collect(),
            );
        }
        for (counter, value) in counters.iter_mut() {
            if counter.kind() != inferscope_model::counters::Kind::Loss {
                continue;
            }
            *value = match &self.losses_at_cut {
                Some(at_cut) => value.saturating_sub(at_cut.get(counter).copied().unwrap_or(0)),
                None => 0,
            };
        }
    }

    pub(crate) fn counters(&self) -> [(Counter, u64); 2] {
        [
            (Counter::RequestsHandedOver, self.handed_over),
            (Counter::RequestsLeftToPreviousAgent, self.left_to_previous),
        ]
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Ownership {
    Ours,
    HandedOver,
    Previous,
}

/// The old agent's stop on SIGTERM: at once when no successor runs; with one, the cut is
/// written and the agent runs on until every request read before it has ended, or `timeout`.
#[derive(Debug)]
pub(crate) struct Drain {
    dir: Option<HandoverDir>,
    timeout: Duration,
    retire_cut: Arc<AtomicU64>,
    state: DrainState,
}

#[derive(Debug)]
enum DrainState {
    Running,
    Draining { cut: u64, until: std::time::Instant },
    Done,
}

/// What the drain asks of the pipeline on each pass.
pub(crate) enum DrainStep {
    KeepRunning,
    Stop,
}

impl Drain {
    pub(crate) fn new(dir: Option<HandoverDir>, timeout: Duration, gate: &Gate) -> Self {
        Self {
            dir,
            timeout,
            retire_cut: gate.retire_cut(),
            state: DrainState::Running,
        }
    }

    /// `stopping`: SIGTERM arrived; `open_read_before(cut)`: requests still open that were read
    /// before `cut`.
    pub(crate) fn step(
        &mut self,
        stopping: bool,
        open_read_before: impl Fn(u64) -> usize,
    ) -> DrainStep {
        match self.state {
            DrainState::Done => DrainStep::Stop,
            DrainState::Running if !stopping => DrainStep::KeepRunning,
            DrainState::Running => {
                let Some((dir, successor)) = self
                    .dir
                    .as_ref()
                    .and_then(|d| d.live_successor().map(|pid| (d, pid)))
                else {
                    self.state = DrainState::Done;
                    return DrainStep::Stop;
                };
                match dir.write_cut() {
                    Ok(cut) => {
                        self.retire_cut.store(cut, Ordering::Release);
                        tracing::info!(
                            successor,
                            timeout = ?self.timeout,
                            "handing over to the next agent: recording the requests read before the cut until they end"
                        );
                        self.state = DrainState::Draining {
                            cut,
                            until: std::time::Instant::now() + self.timeout,
                        };
                        DrainStep::KeepRunning
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot write the handover cut ({e}): stopping now; the next agent records only requests read after this agent exits"
                        );
                        self.state = DrainState::Done;
                        DrainStep::Stop
                    }
                }
            }
            DrainState::Draining { cut, until } => {
                let before_cut = monotonic_now_ns() < cut;
                let open = open_read_before(cut);
                if !before_cut && open == 0 {
                    tracing::info!("handover: every request read before the cut has ended");
                    self.state = DrainState::Done;
                    DrainStep::Stop
                } else if std::time::Instant::now() >= until {
                    tracing::warn!(
                        open,
                        "handover: drain time over; the requests still open end as agent_shutdown (raise --drain-timeout and terminationGracePeriodSeconds for longer generations)"
                    );
                    self.state = DrainState::Done;
                    DrainStep::Stop
                } else {
                    DrainStep::KeepRunning
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(read_ns: u64) -> RequestRecord {
        RequestRecord {
            arrival_read_mono_ns: read_ns,
            ..RequestRecord::default()
        }
    }

    #[test]
    fn a_cut_splits_requests_between_the_two_agents_exactly_once() {
        let shared = tempfile::tempdir().unwrap();
        let dir = HandoverDir::new(shared.path());
        let mut old = Gate::sole();
        let mut new = Gate::successor(dir.clone());
        // Before any cut: the old agent records, the new one leaves it to the old one.
        let early = record(monotonic_now_ns());
        assert!(old.admits(&early));
        assert!(!new.admits(&early));

        // The old agent's SIGTERM with a live successor (this process stands in for it: the
        // file names a pid that is not ours and is alive, our parent's).
        dir.write(
            "successor.pid",
            &format!("{}\n", std::os::unix::process::parent_id()),
        )
        .unwrap();
        let mut drain = Drain::new(Some(dir.clone()), Duration::from_secs(5), &old);
        assert!(matches!(drain.step(false, |_| 0), DrainStep::KeepRunning));
        assert!(matches!(drain.step(true, |_| 1), DrainStep::KeepRunning));
        let cut = dir.read_cut().expect("the cut is written");
        assert!(cut > monotonic_now_ns(), "the cut is ahead of the SIGTERM");

        // The drain holds while requests read before the cut are open, and until the cut.
        assert!(matches!(drain.step(true, |_| 0), DrainStep::KeepRunning));
        // A request read at the cut is gated no earlier than the cut: by then the successor
        // has looked at the file again.
        std::thread::sleep(CUT_LEAD);
        let before = record(cut - 1);
        let after = record(cut);
        for r in [&early, &before, &after] {
            let owners = usize::from(old.admits(r)) + usize::from(new.admits(r));
            assert_eq!(owners, 1, "read at {} (cut {cut})", r.arrival_read_mono_ns);
        }
        assert!(old.admits(&before) && !old.admits(&after));
        assert_eq!(old.counters()[0], (Counter::RequestsHandedOver, 2));
        assert_eq!(new.counters()[1], (Counter::RequestsLeftToPreviousAgent, 3));

        assert!(matches!(
            drain.step(true, |c| usize::from(c == cut)),
            DrainStep::KeepRunning
        ));
        assert!(matches!(drain.step(true, |_| 0), DrainStep::Stop));

        // The new agent takes over with the cut it read; it keeps it.
        assert_eq!(new.took_over(), cut);
        assert!(!new.admits(&before) && new.admits(&after));
    }

    #[test]
    fn without_a_successor_the_old_agent_stops_at_once_and_records_everything() {
        let shared = tempfile::tempdir().unwrap();
        let dir = HandoverDir::new(shared.path());
        let mut gate = Gate::sole();
        let mut drain = Drain::new(Some(dir.clone()), Duration::from_secs(5), &gate);
        assert!(matches!(drain.step(true, |_| 3), DrainStep::Stop));
        assert!(dir.read_cut().is_none());
        assert!(gate.admits(&record(monotonic_now_ns() + 10_000_000_000)));
        // A successor file naming this very process (a stale one from our own standby) is no
        // successor either.
        dir.announce_successor().unwrap();
        assert_eq!(dir.live_successor(), None);
    }

    #[test]
    fn a_successor_counts_losses_from_the_cut_on() {
        let shared = tempfile::tempdir().unwrap();
        let dir = HandoverDir::new(shared.path());
        let mut gate = Gate::successor(dir.clone());
        let snapshot = |lost| {
            vec![
                (Counter::RequestsLost, lost),
                (Counter::KernelRecordsEmitted, 100 + lost),
            ]
        };
        // Joined mid-request on connections opened before it attached: the previous agent's.
        let mut counters = snapshot(4);
        gate.adjust_losses(&mut counters);
        assert_eq!(
            counters,
            vec![
                (Counter::RequestsLost, 0),
                (Counter::KernelRecordsEmitted, 104)
            ]
        );
        dir.write(CUT_FILE, &format!("{}\n", monotonic_now_ns()))
            .unwrap();
        // The successor looks at the file again within CUT_REREAD.
        std::thread::sleep(CUT_REREAD);
        let mut counters = snapshot(5);
        gate.adjust_losses(&mut counters);
        assert_eq!(counters[0], (Counter::RequestsLost, 0));
        let mut counters = snapshot(7);
        gate.adjust_losses(&mut counters);
        assert_eq!(
            counters,
            vec![
                (Counter::RequestsLost, 2),
                (Counter::KernelRecordsEmitted, 107)
            ]
        );
        // An agent alone on the node reports its counters as they are.
        let mut counters = snapshot(7);
        Gate::sole().adjust_losses(&mut counters);
        assert_eq!(counters[0], (Counter::RequestsLost, 7));
    }

    #[test]
    fn a_successor_whose_predecessor_died_without_a_cut_records_from_its_takeover() {
        let shared = tempfile::tempdir().unwrap();
        let mut gate = Gate::successor(HandoverDir::new(shared.path()));
        let before = record(monotonic_now_ns());
        let cut = gate.took_over();
        assert!(cut >= before.arrival_read_mono_ns);
        assert!(gate.admits(&record(cut + 1)));
    }
}
