//! What the kernel's verifier made of each program: loaded, refused or not needed on this
//! kernel, and how many instructions it walked (our headroom under its budget, which differs
//! between kernels: older verifiers prune less). `inferscope check --programs` prints it;
//! `scripts/kernels.sh` fails the kernel matrix when any program passes 75 % of the budget.
use std::fmt;

use aya::Ebpf;
use tracing::{debug, info, warn};

/// The kernel's verifier walks at most this many instructions of one program.
pub(crate) const VERIFIER_BUDGET: u32 = 1_000_000;

/// Percent of the budget past which a program is at risk on a kernel whose verifier prunes
/// less: `check` and the load log warn, and `scripts/kernels.sh` fails the kernel matrix (its
/// `VERIFIER_SHARE_MAX`).
pub(crate) const AT_RISK_SHARE: f64 = 75.0;

/// Whether this kernel runs a program of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProgramLoad {
    Loaded,
    /// The kernel refused it; the agent took the fallback the load log names.
    Refused,
    /// Not needed on this kernel (a fallback's program where the fast path loaded, an engine's
    /// tail call never installed).
    Unused,
}

impl fmt::Display for ProgramLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            ProgramLoad::Loaded => "loaded",
            ProgramLoad::Refused => "refused",
            ProgramLoad::Unused => "unused",
        })
    }
}

/// One program of the object on this kernel.
#[derive(Debug, Clone)]
pub(crate) struct ProgramState {
    pub name: String,
    pub load: ProgramLoad,
    /// Instructions the verifier walked (kernels since 5.16 report it).
    pub verified: Option<u32>,
}

impl ProgramState {
    /// Percent of the verifier's budget the program took.
    pub(crate) fn budget_share(&self) -> Option<f64> {
        self.verified
            .map(|v| f64::from(v) / f64::from(VERIFIER_BUDGET) * 100.0)
    }
}

/// Every program of `ebpf`, in name order; `refused` names those the kernel would not load.
pub(crate) fn program_states(ebpf: &Ebpf, refused: &[&str]) -> Vec<ProgramState> {
    let mut states: Vec<ProgramState> = ebpf
        .programs()
        .map(|(name, program)| {
            let loaded = program.fd().is_ok();
            ProgramState {
                name: name.to_string(),
                load: if loaded {
                    ProgramLoad::Loaded
                } else if refused.contains(&name) {
                    ProgramLoad::Refused
                } else {
                    ProgramLoad::Unused
                },
                verified: loaded
                    .then(|| program.info().ok())
                    .flatten()
                    .and_then(|info| info.verified_instruction_count()),
            }
        })
        .collect();
    states.sort_by(|a, b| a.name.cmp(&b.name));
    states
}

/// Logs how much of the verifier's budget each loaded program took. `exit_syscall` has come
/// within a few percent of it on one kernel, and the count differs between kernels: this says
/// how close a user's kernel came.
pub(crate) fn log_headroom(states: &[ProgramState]) {
    for state in states {
        if let Some(verified) = state.verified {
            debug!(program = %state.name, verified, "instructions the verifier walked");
        }
    }
    let largest = states
        .iter()
        .filter_map(|s| Some((s, s.verified?)))
        .max_by_key(|(_, verified)| *verified);
    if let Some((state, verified)) = largest {
        let share = state.budget_share().unwrap_or_default();
        let name = &state.name;
        if share >= AT_RISK_SHARE {
            warn!(
                "largest eBPF program {name}: {verified} instructions verified ({share:.0}% of the verifier's budget of {VERIFIER_BUDGET}): a kernel whose verifier prunes less may refuse it"
            );
        } else {
            info!(
                "largest eBPF program {name}: {verified} instructions verified ({share:.0}% of the verifier's budget)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_share_is_a_percentage_of_the_verifier_budget() {
        let state = ProgramState {
            name: "exit_syscall".into(),
            load: ProgramLoad::Loaded,
            verified: Some(750_000),
        };
        assert_eq!(state.budget_share(), Some(75.0));
        let unreported = ProgramState {
            verified: None,
            ..state
        };
        assert_eq!(unreported.budget_share(), None);
    }
}
