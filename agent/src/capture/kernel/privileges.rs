//! What the agent may do on this kernel with the capabilities it was given, checked once at
//! start and said in one log line: which features will be missing and which capability adds
//! each. [`REQUIREMENTS`] is the one list of capabilities the agent needs; deploy/ follows it.
//!
//! Measured on kernel 6.18 (perf_event_paranoid 2, uid 0 with a reduced bounding set, the way a
//! container with `capabilities.add` runs), see docs/src/kubernetes.md:
//! - BPF maps, ring buffers and tracing programs load with CAP_BPF + CAP_PERFMON;
//! - tracepoint perf events (`perf_event_open` type TRACEPOINT, all CPUs) open with CAP_PERFMON;
//! - uprobe perf events (the `uprobe` PMU) are refused with EACCES unless CAP_SYS_ADMIN is
//!   present, whatever else is: without it every scheduler hook fails and queue wait / prefill
//!   are not measured;
//! - `/proc/PID/root/...` (engine libraries), `/proc/PID/exe` and `pidfd_getfd()` on the
//!   engine's sockets need CAP_SYS_PTRACE (the target holds capabilities the agent lacks);
//! - files only their owner may read need CAP_DAC_READ_SEARCH (uid 0 without DAC_OVERRIDE).
use std::fmt;

/// A Linux capability the agent may use, by its number in `linux/capability.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capability {
    DacReadSearch = 2,
    SysPtrace = 19,
    SysAdmin = 21,
    SysResource = 24,
    Perfmon = 38,
    Bpf = 39,
}

impl Capability {
    /// The name as Kubernetes' `capabilities.add` and podman's `--cap-add` spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Capability::DacReadSearch => "DAC_READ_SEARCH",
            Capability::SysPtrace => "SYS_PTRACE",
            Capability::SysAdmin => "SYS_ADMIN",
            Capability::SysResource => "SYS_RESOURCE",
            Capability::Perfmon => "PERFMON",
            Capability::Bpf => "BPF",
        }
    }

    fn bit(self) -> u64 {
        1 << (self as u64)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CAP_{}", self.name())
    }
}

/// One feature of the agent and the capability it needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Requirement {
    pub feature: &'static str,
    pub capability: Capability,
    /// Kernels before this (major, minor) need it; `None`: every kernel.
    pub before_kernel: Option<(u32, u32)>,
}

/// Every capability the agent uses, once (deploy/base/daemonset.yaml adds exactly these).
pub(crate) const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        feature: "eBPF programs, maps and the ring buffer (all capture)",
        capability: Capability::Bpf,
        before_kernel: None,
    },
    Requirement {
        feature: "socket and process tracepoints (all capture)",
        capability: Capability::Perfmon,
        before_kernel: None,
    },
    Requirement {
        feature: "engine scheduler uprobes (queue wait vs prefill, steps, user probes)",
        capability: Capability::SysAdmin,
        before_kernel: None,
    },
    Requirement {
        feature: "engine libraries through /proc/PID/root and pidfd_getfd on engine sockets (scheduler hooks, connection identity)",
        capability: Capability::SysPtrace,
        before_kernel: None,
    },
    Requirement {
        feature: "engine files readable only by their owner",
        capability: Capability::DacReadSearch,
        before_kernel: None,
    },
    Requirement {
        feature: "locked memory for BPF maps",
        capability: Capability::SysResource,
        before_kernel: Some((5, 11)),
    },
];

/// The capabilities to grant instead of root, as error messages say them
/// ("CAP_BPF + CAP_PERFMON + …"): every requirement of kernels the agent supports.
pub(crate) fn capabilities_needed() -> String {
    REQUIREMENTS
        .iter()
        .filter(|r| r.before_kernel.is_none())
        .map(|r| r.capability.to_string())
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The effective capability set and the kernel settings that decide what the agent can do.
#[derive(Debug, Clone, Default)]
pub(crate) struct Privileges {
    pub effective: u64,
    pub kernel: Option<(u32, u32)>,
    pub perf_event_paranoid: Option<i32>,
    pub btf: bool,
    pub tracefs: bool,
}

impl Privileges {
    /// Reads /proc/self/status, the kernel release and the settings under /proc/sys and /sys.
    pub(crate) fn read() -> Privileges {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        Privileges {
            effective: parse_cap_eff(&status).unwrap_or(0),
            kernel: parse_release(&release),
            perf_event_paranoid: std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            tracefs: std::path::Path::new("/sys/kernel/tracing/events").is_dir()
                || std::path::Path::new("/sys/kernel/debug/tracing/events").is_dir(),
        }
    }

    /// Whether the agent holds `cap` or one the kernel accepts in its place (CAP_SYS_ADMIN
    /// stands for CAP_BPF and CAP_PERFMON, which kernels before 5.8 do not know).
    pub(crate) fn has(&self, cap: Capability) -> bool {
        let admin = self.effective & Capability::SysAdmin.bit() != 0;
        self.effective & cap.bit() != 0
            || (admin && matches!(cap, Capability::Bpf | Capability::Perfmon))
    }

    /// The requirements this kernel has (whether met or not).
    pub(crate) fn applicable(&self) -> impl Iterator<Item = &'static Requirement> + '_ {
        REQUIREMENTS
            .iter()
            .filter(|r| match (r.before_kernel, self.kernel) {
                (Some(before), Some(kernel)) => kernel < before,
                _ => true,
            })
    }

    /// The requirements this kernel has and the agent's capabilities do not meet.
    pub(crate) fn missing(&self) -> Vec<&'static Requirement> {
        self.applicable()
            .filter(|r| !self.has(r.capability))
            .collect()
    }

    /// One line for the log: everything available, or what is missing and what adds it.
    pub(crate) fn summary(&self) -> String {
        let mut problems: Vec<String> = self
            .missing()
            .iter()
            .map(|r| format!("{} (add {})", r.feature, r.capability))
            .collect();
        if !self.btf {
            problems.push(
                "kernel BTF (/sys/kernel/btf/vmlinux; mount it into the container)".to_string(),
            );
        }
        if !self.tracefs {
            problems.push(
                "tracefs (mount -t tracefs nodev /sys/kernel/tracing, or mount the host's)"
                    .to_string(),
            );
        }
        let paranoid = self
            .perf_event_paranoid
            .map_or_else(|| "?".to_string(), |p| p.to_string());
        if problems.is_empty() {
            format!(
                "privileges: every feature available (CapEff {:#x}, perf_event_paranoid {paranoid})",
                self.effective
            )
        } else {
            format!(
                "privileges: missing: {} (CapEff {:#x}, perf_event_paranoid {paranoid})",
                problems.join("; "),
                self.effective
            )
        }
    }
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_name_every_capability_the_daemonset_adds() {
        assert_eq!(
            capabilities_needed(),
            "CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN + CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH"
        );
        let daemonset = include_str!("../../../../deploy/base/daemonset.yaml");
        for cap in capabilities_needed().split(" + ") {
            let name = cap.trim_start_matches("CAP_");
            assert!(daemonset.contains(name), "{name} is not in the DaemonSet");
        }
    }

    fn with(caps: &[Capability]) -> Privileges {
        Privileges {
            effective: caps.iter().fold(0, |acc, c| acc | c.bit()),
            kernel: Some((6, 18)),
            perf_event_paranoid: Some(2),
            btf: true,
            tracefs: true,
        }
    }

    #[test]
    fn reads_the_effective_set_as_proc_prints_it() {
        // podman --cap-drop ALL --cap-add BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH,SYS_RESOURCE
        let status = "Name:\tinferscope\nCapInh:\t0000000000000000\nCapPrm:\t000000c001080004\nCapEff:\t000000c001080004\n";
        let eff = parse_cap_eff(status).unwrap();
        let p = Privileges {
            effective: eff,
            ..with(&[])
        };
        for c in [
            Capability::Bpf,
            Capability::Perfmon,
            Capability::SysPtrace,
            Capability::DacReadSearch,
            Capability::SysResource,
        ] {
            assert!(p.has(c), "{c}");
        }
        assert!(!p.has(Capability::SysAdmin));
        assert_eq!(parse_release("6.18.44-fc-v857\n"), Some((6, 18)));
        assert_eq!(parse_release("5.4.0-150-generic"), Some((5, 4)));
    }

    #[test]
    fn the_set_without_sys_admin_loses_the_scheduler_hooks_only() {
        let p = with(&[
            Capability::Bpf,
            Capability::Perfmon,
            Capability::SysPtrace,
            Capability::DacReadSearch,
        ]);
        let missing = p.missing();
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].capability, Capability::SysAdmin);
        let line = p.summary();
        assert!(line.contains("scheduler uprobes"), "{line}");
        assert!(line.contains("add CAP_SYS_ADMIN"), "{line}");
    }

    #[test]
    fn sys_admin_stands_for_bpf_and_perfmon_and_old_kernels_need_memlock() {
        let p = with(&[
            Capability::SysAdmin,
            Capability::SysPtrace,
            Capability::DacReadSearch,
        ]);
        assert!(p.missing().is_empty(), "{:?}", p.missing());
        assert!(
            p.summary()
                .starts_with("privileges: every feature available")
        );
        let old = Privileges {
            kernel: Some((5, 10)),
            ..p
        };
        assert_eq!(old.missing()[0].capability, Capability::SysResource);
    }

    #[test]
    fn no_capabilities_and_no_tracefs_say_everything() {
        let p = Privileges {
            tracefs: false,
            btf: false,
            ..with(&[])
        };
        let line = p.summary();
        for needle in [
            "add CAP_BPF",
            "add CAP_PERFMON",
            "add CAP_SYS_ADMIN",
            "add CAP_SYS_PTRACE",
            "tracefs",
            "BTF",
        ] {
            assert!(line.contains(needle), "{needle}: {line}");
        }
        assert!(!line.contains('\n'));
    }
}
