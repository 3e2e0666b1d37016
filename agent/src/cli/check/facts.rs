//! What `inferscope check` looks at, each through the code the agent itself runs: privileges
//! (capture::kernel::privileges), the kernel programs (SocketProbes), discovery and the engine plugins'
//! hooks (capture::process::discovery, capture::elf::sched_hooks, engines).
use std::path::{Path, PathBuf};

use super::{Report, Status};
use crate::{
    capture::{
        CaptureConfig, Discovery, SocketProbes, TargetSelector, TracedProcess,
        elf::sched_hooks,
        kernel::privileges::{Capability, Privileges},
        process::{
            procfs,
            sockets::{FdKind, ProcessHandle},
        },
    },
    engines,
};

/// What to look at.
pub(crate) struct Options {
    pub selector: TargetSelector,
    pub capture: CaptureConfig,
    pub token_hooks: bool,
    /// The CUPTI shim's socket (None: the GPU inputs are off).
    pub shim_socket: Option<PathBuf>,
    /// Attach each engine's hooks for a moment (and detach them): `check` does; `run`, which
    /// attaches them for good right after, does not.
    pub try_engine_hooks: bool,
}

/// Full-size syscall records the loop can fall behind by before the ring drops records, and the
/// loop's longest sleep (it reads the ring at least this often).
const RECORD_HEADER_BYTES: u64 = 80 + 8;
const LOOP_PERIOD_MS: u64 = 50;

/// The largest program's share of the verifier's budget on this kernel, and the programs it
/// refused (each has a fallback, named on its own line).
fn verifier(report: &mut Report, probes: &SocketProbes) {
    use crate::capture::kernel::verifier::{AT_RISK_SHARE, ProgramLoad, VERIFIER_BUDGET};
    let programs = probes.programs();
    let refused: Vec<&str> = programs
        .iter()
        .filter(|p| p.load == ProgramLoad::Refused)
        .map(|p| p.name.as_str())
        .collect();
    let largest = programs
        .iter()
        .filter_map(|p| Some((p, p.verified?, p.budget_share()?)))
        .max_by_key(|(_, verified, _)| *verified);
    let refused_text = if refused.is_empty() {
        String::new()
    } else {
        format!("; refused here: {}", refused.join(", "))
    };
    match largest {
        Some((program, verified, share)) => report.push(
            if share >= AT_RISK_SHARE {
                Status::Warn
            } else {
                Status::Ok
            },
            "verifier",
            format!(
                "largest program {}: {verified} instructions verified ({share:.0}% of the budget of {VERIFIER_BUDGET}){refused_text}",
                program.name
            ),
        ),
        None => report.push(
            Status::Info,
            "verifier",
            format!(
                "this kernel does not report verified instruction counts (5.16+){refused_text}"
            ),
        ),
    }
}

/// Gathers the report. `probes`: the loaded kernel programs, or why they did not load.
pub(crate) fn gather(mut probes: Result<&mut SocketProbes, String>, options: &Options) -> Report {
    let mut report = Report::default();
    let privileges = Privileges::read();
    kernel(&mut report, &privileges);
    capabilities(&mut report, &privileges);
    tracefs(&mut report);
    match probes.as_deref_mut() {
        Ok(probes) => {
            report.capture = true;
            report.push(
                Status::Ok,
                "ebpf",
                "programs loaded; socket and process tracepoints attached",
            );
            match probes.sock_hook_refused() {
                None => report.push(Status::Ok, "fexit", "fexit on inet_csk_accept attached"),
                Some(why) if probes.socket_walk() => report.push(
                    Status::Ok,
                    "fexit",
                    format!(
                        "fexit on inet_csk_accept refused ({}): an accepted connection's socket is found from its fd at the accept (struct offsets from the kernel's BTF)",
                        why.trim_end_matches([' ', ':'])
                            .trim_end_matches(". Verifier output")
                    ),
                ),
                Some(why) => report.push(
                    Status::Warn,
                    "fexit",
                    format!(
                        "fexit on inet_csk_accept refused ({}): fallback tcp:tcp_rcv_space_adjust (a connection's socket is learnt at its first read; every TCP read on the host runs a program)",
                        why.trim_end_matches([' ', ':'])
                            .trim_end_matches(". Verifier output")
                    ),
                ),
            }
            match probes.reads_at_entry_reason() {
                None => report.push(
                    Status::Ok,
                    "reads",
                    format!(
                        "reads take their arguments at their exit (one program run per read; registers {})",
                        probes.exit_loads()
                    ),
                ),
                Some(why) => report.push(
                    Status::Ok,
                    "reads",
                    format!(
                        "reads take their arguments at their entry ({why}): one more program run per read"
                    ),
                ),
            }
            match probes.writes_at_entry_reason() {
                None => report.push(
                    Status::Ok,
                    "writes",
                    format!(
                        "writes take their arguments at their exit and their time from their socket's transmit stamp (one program run per write; registers and stamp {})",
                        probes.exit_loads()
                    ),
                ),
                Some(why) => report.push(
                    Status::Ok,
                    "writes",
                    format!(
                        "writes take their arguments and time at their entry ({why}): one more program run per write"
                    ),
                ),
            }
            verifier(&mut report, probes);
            match probes.uprobe_self_test() {
                Ok(()) => {
                    report.uprobes = true;
                    report.push(Status::Ok, "uprobes", "a test uprobe attached and detached");
                }
                Err(e) => report.push(
                    Status::Fail,
                    "uprobes",
                    format!(
                        "unavailable ({e}): no engine scheduler hooks, so no queue wait / prefill split from the engine, no steps, no user probes{}",
                        if privileges.has(Capability::SysAdmin) {
                            String::new()
                        } else {
                            format!(" (add {})", Capability::SysAdmin)
                        }
                    ),
                ),
            }
        }
        Err(e) => report.push(Status::Fail, "ebpf", format!("cannot load: {e}")),
    }
    ring(&mut report, &options.capture);
    let found = engines_found(&options.selector);
    if found.is_empty() {
        report.push(
            Status::Warn,
            "engines",
            "no engine process serving on TCP found on this node",
        );
    }
    let mut injected = 0;
    for process in &found {
        let (shim, on) = shim_injection(process.tgid);
        injected += usize::from(on);
        let status = engine(
            &mut report,
            process,
            probes.as_deref_mut().ok(),
            options,
            &shim,
        );
        if report.capture && status != Status::Fail {
            report.engines += 1;
        }
    }
    if let Some(path) = &options.shim_socket {
        shim_socket(&mut report, path, injected);
    }
    report
}

fn kernel(report: &mut Report, privileges: &Privileges) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let tested = crate::capture::kernel::probes::TESTED_KERNELS;
    let (status, note) = match privileges.kernel {
        Some(k) if k >= (5, 10) => (
            Status::Ok,
            format!("tested kernels: {tested}; the oldest supported is 5.8"),
        ),
        Some(k) if k >= (5, 8) => (
            Status::Warn,
            format!(
                "older than every tested kernel ({tested}); 5.8 is the oldest that has what the agent needs"
            ),
        ),
        Some(_) => (
            Status::Fail,
            format!(
                "older than 5.8, which brought the BPF ring buffer every capture needs: the agent does not run here (tested kernels: {tested})"
            ),
        ),
        None => (Status::Info, format!("tested kernels: {tested}")),
    };
    report.push(
        status,
        "kernel",
        format!("Linux {release} ({}): {note}", std::env::consts::ARCH),
    );
    if privileges.btf {
        report.push(Status::Ok, "btf", "/sys/kernel/btf/vmlinux present");
    } else {
        report.push(
            Status::Warn,
            "btf",
            "/sys/kernel/btf/vmlinux missing (mount it into the container): no fexit, engine struct offsets only from DWARF or the source",
        );
    }
    let paranoid = privileges
        .perf_event_paranoid
        .map_or_else(|| "unreadable".to_string(), |p| p.to_string());
    report.push(
        Status::Info,
        "perf",
        format!("perf_event_paranoid {paranoid} (the capabilities below decide)"),
    );
}

fn capabilities(report: &mut Report, privileges: &Privileges) {
    for requirement in privileges.applicable() {
        let cap = requirement.capability;
        if privileges.has(cap) {
            report.push(
                Status::Ok,
                "capability",
                format!("{cap}: {}", requirement.feature),
            );
        } else {
            let status = match cap {
                Capability::Bpf | Capability::Perfmon => Status::Fail,
                _ => Status::Warn,
            };
            report.push(
                status,
                "capability",
                format!("{cap} missing: without it no {}", requirement.feature),
            );
        }
    }
}

fn tracefs(report: &mut Report) {
    let tracing = Path::new("/sys/kernel/tracing/events").is_dir();
    let debug = Path::new("/sys/kernel/debug/tracing/events").is_dir();
    match (tracing, debug) {
        (true, _) => report.push(Status::Ok, "tracefs", "/sys/kernel/tracing mounted"),
        (false, true) => report.push(
            Status::Ok,
            "tracefs",
            "through debugfs at /sys/kernel/debug/tracing",
        ),
        (false, false) => report.push(
            Status::Fail,
            "tracefs",
            "not mounted (mount -t tracefs nodev /sys/kernel/tracing, or mount the host's): tracepoint layouts unreadable, tcp:tcp_probe and sock:inet_sock_set_state unattached",
        ),
    }
    report.push(
        Status::Info,
        "debugfs",
        if Path::new("/sys/kernel/debug/tracing").is_dir() {
            "mounted at /sys/kernel/debug (not needed where tracefs is)"
        } else {
            "not mounted (not needed where tracefs is)"
        },
    );
}

fn ring(report: &mut Report, capture: &CaptureConfig) {
    let full = RECORD_HEADER_BYTES + u64::from(capture.capture_bytes);
    let records = u64::from(capture.ring_buffer_bytes) / full.max(1);
    let per_second = records * 1000 / LOOP_PERIOD_MS;
    let status = if records < 1000 {
        Status::Warn
    } else {
        Status::Ok
    };
    report.push(
        status,
        "ring",
        format!(
            "{} MiB holds {records} full-size records ({} B captured each): a burst of more captured syscalls between two reads (at least every {LOOP_PERIOD_MS} ms) is dropped and counted (kernel_ringbuf_full_drops); about {per_second} syscalls/s, i.e. streamed tokens/s on this node, before that{}",
            capture.ring_buffer_bytes / (1024 * 1024),
            capture.capture_bytes,
            if status == Status::Warn {
                " (raise --ring-buffer-mb)"
            } else {
                ""
            }
        ),
    );
}

fn engines_found(selector: &TargetSelector) -> Vec<TracedProcess> {
    let mut discovery = Discovery::new(selector.clone(), engines::identify);
    let mut found = discovery.scan().added;
    found.sort_by_key(|p| p.tgid);
    found
}

/// The engine's CUDA_INJECTION64_PATH, as a phrase, and whether it is set.
fn shim_injection(tgid: u32) -> (String, bool) {
    match procfs::environ_var(tgid, "CUDA_INJECTION64_PATH") {
        Ok(Some(path)) => (format!("CUPTI shim injected ({path})"), true),
        Ok(None) => (
            "no CUPTI shim injected (no kernel timings for this engine)".into(),
            false,
        ),
        Err(e) => (format!("environment unreadable ({e})"), false),
    }
}

/// One line for an engine process; returns its status.
fn engine(
    report: &mut Report,
    process: &TracedProcess,
    probes: Option<&mut SocketProbes>,
    options: &Options,
    shim: &str,
) -> Status {
    let mut status = Status::Ok;
    let mut parts = Vec::new();
    parts.push(format!(
        "{} pid {} port{} {}, version {}",
        process.engine,
        process.tgid,
        if process.ports.len() == 1 { "" } else { "s" },
        process
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(","),
        engines::version_of(process.tgid, process.engine).unwrap_or_else(|| "unknown".into())
    ));
    match engines::hook_set(process.engine).filter(|set| !set.hooks.is_empty()) {
        Some(set) => {
            let resolution = sched_hooks::resolve(process.tgid, set, options.token_hooks);
            let found = resolution.hooks.iter().filter(|(_, ok)| *ok).count();
            let total = resolution.hooks.len();
            let objects = resolution
                .objects
                .iter()
                .map(|p| p.rsplit('/').next().unwrap_or(p))
                .collect::<Vec<_>>()
                .join(", ");
            let mut hooks = format!(
                "scheduler hooks: {found} of {total} resolve in {}",
                if objects.is_empty() {
                    "no mapped engine object"
                } else {
                    &objects
                }
            );
            for (hook, _) in resolution.hooks.iter().filter(|(_, ok)| !ok) {
                hooks.push_str(&format!(" (missing {}: loses {})", hook.symbol, hook.gives));
            }
            for why in &resolution.unreadable {
                hooks.push_str(&format!(" ({why})"));
            }
            if found < total {
                status = Status::Warn;
            }
            if options.try_engine_hooks
                && found > 0
                && let Some(probes) = probes
            {
                let outcome =
                    sched_hooks::attach(probes, process.tgid, Some(set), None, options.token_hooks);
                probes.detach_uprobes(process.tgid);
                hooks.push_str(&format!(", {} of {found} attach", outcome.live));
                if outcome.live < found {
                    status = Status::Warn;
                }
            }
            parts.push(hooks);
        }
        None => parts.push("no scheduler uprobes for this engine".into()),
    }
    if engines::decodes_ipc(process.engine) {
        parts.push(match ipc_sockets(process.tgid) {
            Ok(n) if n > 0 => format!("IPC decoded: {n} Unix stream socket(s) open"),
            Ok(_) => {
                status = Status::Warn;
                "IPC decoded, but no Unix stream socket open yet".into()
            }
            Err(e) => {
                status = Status::Warn;
                format!(
                    "IPC sockets cannot be inspected ({e}; add {})",
                    Capability::SysPtrace
                )
            }
        });
    }
    parts.push(shim.to_owned());
    report.push(status, "engine", parts.join("; "));
    status
}

/// Connected Unix stream sockets of `tgid` (ZeroMQ ipc:// and the like).
fn ipc_sockets(tgid: u32) -> std::io::Result<usize> {
    let handle = ProcessHandle::open(tgid)?;
    let mut count = 0;
    for fd in procfs::socket_fds(tgid) {
        if matches!(handle.inspect(fd)?, FdKind::UnixStream) {
            count += 1;
        }
    }
    Ok(count)
}

fn shim_socket(report: &mut Report, path: &Path, injected: usize) {
    use std::os::unix::fs::FileTypeExt as _;
    let listening = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket());
    let (status, text) = match (listening, injected) {
        (true, _) => (
            Status::Ok,
            format!(
                "{} present (an agent listens); {injected} engine(s) have CUDA_INJECTION64_PATH set",
                path.display()
            ),
        ),
        (false, 0) => (
            Status::Info,
            format!(
                "{} absent (`inferscope run` creates it); no engine has CUDA_INJECTION64_PATH set",
                path.display()
            ),
        ),
        (false, n) => (
            Status::Warn,
            format!(
                "{} absent, but {n} engine(s) have CUDA_INJECTION64_PATH set: their kernel records go nowhere until `inferscope run` listens",
                path.display()
            ),
        ),
    };
    report.push(status, "shim", text);
}
