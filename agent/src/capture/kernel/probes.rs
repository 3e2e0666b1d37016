//! Loads and attaches the socket programs and owns their maps. Dropping [`SocketProbes`] detaches
//! every program (aya closes the links with the object).
use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{
        FExit, TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use aya_log::EbpfLogger;
use inferscope_common::{
    COUNTER_SLOTS, ConnEntry, Counter, MAX_CAPTURE_BYTES, StreamTemplate, SyscallRecord,
    TOKEN_BATCH_MAX, TokenBatchEntry, TokenBatchRecord, UserProbeConfig, fd_key,
};
use tracing::{debug, info, warn};

use crate::capture::kernel::{
    btf::{ExitArgs, SocketWalk},
    tracefs::{self, Format, TcpProbeOffsets},
};

/// The kernels `scripts/kernels.sh` boots and runs the in-guest suite on (CI runs it on each
/// submission): Debian's 5.10, 6.1, 6.12 and 7.3.
pub(crate) const TESTED_KERNELS: &str = "5.10, 6.1, 6.12 and 7.3";

/// Sizes of the kernel-side buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CaptureConfig {
    /// Payload prefix copied per syscall (at most [`MAX_CAPTURE_BYTES`]).
    pub capture_bytes: u32,
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_buffer_bytes: u32,
    /// GPU launches one process may emit per second (and CPU) before the launch probes sample
    /// one in 16 (0: no cap).
    pub gpu_launch_cap: u32,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            capture_bytes: 4096,
            ring_buffer_bytes: 16 * 1024 * 1024,
            gpu_launch_cap: 20_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CaptureError {
    #[error(
        "loading the eBPF programs failed: {0}. inferscope needs root (or {caps}) and a kernel with BTF",
        caps = crate::capture::kernel::privileges::capabilities_needed()
    )]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the embedded eBPF object could not be prepared for this kernel: {0}")]
    Object(#[from] super::kfunc::KfuncError),
    #[error("eBPF program {name} is missing from the embedded object (a build problem)")]
    MissingProgram { name: &'static str },
    #[error("eBPF map {name} is missing or has the wrong type: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error(
        "attaching {program} to tracepoint {category}:{tracepoint} failed: {source}. Is tracefs mounted (mount -t tracefs nodev /sys/kernel/tracing)?"
    )]
    Attach {
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("invalid capture configuration: {0}")]
    Config(String),
    #[error(
        "Linux {release} is older than inferscope supports: it needs the BPF ring buffer (Linux 5.8 or newer). Tested kernels: {tested} (docs/src/kernels.md)",
        tested = TESTED_KERNELS
    )]
    KernelTooOld { release: String },
    #[error(
        "the record program {program} (the second half of a capture, tail-called) did not load: {reason}. It needs a kernel with BPF tail calls (4.2+); a verifier refusal names the instruction it stopped at: please report it with `uname -r`"
    )]
    TailCall {
        program: &'static str,
        reason: String,
    },
}

/// (program, tracepoint category, tracepoint name), attached always. write/sendto (and
/// read/recvfrom) share a program because their first three arguments (fd, buffer, length)
/// have the same shape.
const ATTACHMENTS: &[(&str, &str, &str)] = &[
    ("enter_accept", "syscalls", "sys_enter_accept"),
    ("enter_accept", "syscalls", "sys_enter_accept4"),
    ("enter_close", "syscalls", "sys_enter_close"),
    ("enter_shutdown", "syscalls", "sys_enter_shutdown"),
    ("enter_dup", "syscalls", "sys_enter_dup"),
    ("enter_dup2", "syscalls", "sys_enter_dup2"),
    ("enter_dup2", "syscalls", "sys_enter_dup3"),
    ("enter_bind", "syscalls", "sys_enter_bind"),
    ("thread_exit", "sched", "sched_process_exit"),
    ("exit_accept", "syscalls", "sys_exit_accept"),
    ("exit_accept", "syscalls", "sys_exit_accept4"),
    ("exit_syscall", "syscalls", "sys_exit_dup"),
    ("exit_syscall", "syscalls", "sys_exit_dup2"),
    ("exit_syscall", "syscalls", "sys_exit_dup3"),
];

/// Reads, where their exits take the arguments from the thread's saved registers (one program
/// run per read, on every read of the host).
const READS_AT_EXIT: &[(&str, &str, &str)] = &[
    ("exit_read_args", "syscalls", "sys_exit_read"),
    ("exit_read_args", "syscalls", "sys_exit_recvfrom"),
    ("exit_readv_args", "syscalls", "sys_exit_readv"),
    ("exit_recvmsg_args", "syscalls", "sys_exit_recvmsg"),
];

/// Writes, where their exits take the arguments from the thread's saved registers and the
/// time from the socket's transmit stamp.
const WRITES_AT_EXIT: &[(&str, &str, &str)] = &[
    ("exit_write_args", "syscalls", "sys_exit_write"),
    ("exit_write_args", "syscalls", "sys_exit_sendto"),
    ("exit_writev_args", "syscalls", "sys_exit_writev"),
    ("exit_sendmsg_args", "syscalls", "sys_exit_sendmsg"),
];

/// Writes elsewhere: an entry program saves the arguments and the time for the shared exit.
const WRITES_AT_ENTRY: &[(&str, &str, &str)] = &[
    ("enter_write", "syscalls", "sys_enter_write"),
    ("enter_write", "syscalls", "sys_enter_sendto"),
    ("enter_writev", "syscalls", "sys_enter_writev"),
    ("enter_sendmsg", "syscalls", "sys_enter_sendmsg"),
    ("exit_syscall", "syscalls", "sys_exit_write"),
    ("exit_syscall", "syscalls", "sys_exit_sendto"),
    ("exit_syscall", "syscalls", "sys_exit_writev"),
    ("exit_syscall", "syscalls", "sys_exit_sendmsg"),
];

/// Reads elsewhere: an entry program saves the arguments for the shared exit.
const READS_AT_ENTRY: &[(&str, &str, &str)] = &[
    ("enter_read", "syscalls", "sys_enter_read"),
    ("enter_read", "syscalls", "sys_enter_recvfrom"),
    ("enter_readv", "syscalls", "sys_enter_readv"),
    ("enter_recvmsg", "syscalls", "sys_enter_recvmsg"),
    ("exit_syscall", "syscalls", "sys_exit_read"),
    ("exit_syscall", "syscalls", "sys_exit_recvfrom"),
    ("exit_syscall", "syscalls", "sys_exit_readv"),
    ("exit_syscall", "syscalls", "sys_exit_recvmsg"),
];

/// Loads `program` (a tracepoint or uprobe program that is tail-called, never attached) into
/// slot 0 of the program array `slots`.
fn install_tail_call(
    ebpf: &mut Ebpf,
    program: &'static str,
    slots: &'static str,
) -> Result<(), String> {
    let prog = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("{program} is missing from the object"))?;
    match prog {
        aya::programs::Program::TracePoint(p) => p.load(),
        aya::programs::Program::UProbe(p) => p.load(),
        _ => {
            return Err(format!(
                "{program} is neither a tracepoint nor a uprobe program"
            ));
        }
    }
    .map_err(|e| format!("{e}"))?;
    let fd = prog
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| format!("{e}"))?;
    let map = ebpf
        .map_mut(slots)
        .ok_or_else(|| format!("{slots} is missing from the object"))?;
    let mut array = ProgramArray::try_from(map).map_err(|e| format!("{e}"))?;
    array.set(0, &fd, 0).map_err(|e| format!("{e}"))
}

/// The uprobe program that `tls_return` tail-calls: loaded, never attached.
const TLS_RECORD_PROGRAM: &str = "tls_record";

static PROGRAM_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/inferscope"));

/// The same programs built for kernels without `bpf_loop` (before 5.17; the eBPF crate's
/// feature `legacy`): no program names a `bpf_loop` callback, which kernels before 5.13 refuse,
/// and sends and receives past one record are not captured in chunk series.
static LEGACY_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/legacy/inferscope"));

/// The eBPF object as built, before its kfunc calls are patched ([`super::kfunc`]).
#[cfg(test)]
pub(super) fn program_object() -> &'static [u8] {
    PROGRAM_OBJECT
}

pub(crate) struct SocketProbes {
    // Keeps programs and links alive; dropping it detaches everything.
    ebpf: Ebpf,
    /// Scheduler uprobes attached per process, to detach when it goes.
    uprobe_links: std::collections::HashMap<u32, Vec<(String, UProbeLinkId)>>,
    /// User-defined probes attached per (process, probe index), to disable one on its own.
    user_links: std::collections::HashMap<(u32, u32), Vec<(&'static str, UProbeLinkId)>>,
    user_configs: Array<MapData, UserProbeConfig>,
    events: RingBuf<MapData>,
    /// Bitmap of traced tgids (see TARGETS in the eBPF crate).
    targets: Array<MapData, u64>,
    /// Bitmap of watched local ports (see PORTS in the eBPF crate).
    ports: Array<MapData, u64>,
    fd_verdicts: HashMap<MapData, u64, u64>,
    /// (tgid, fd) → connection id carrying engine IPC, never cut under back-pressure.
    keep_whole: HashMap<MapData, u64, u64>,
    /// tgid → the process's token event template (connections copy it at their heads).
    process_templates: HashMap<MapData, u32, StreamTemplate>,
    /// Stamped on each installed template, so the kernel can tell a value rewritten under it.
    template_version: u32,
    /// (tgid, fd) → the connection's template and its token events not yet sent (the kernel's).
    stream_templates: Array<MapData, StreamTemplate>,
    /// (tgid, fd) → connection, written by the kernel at accept; user space adds only the
    /// connections that predate the agent.
    conns: HashMap<MapData, u64, ConnEntry>,
    /// Connection id → its close record that did not fit in the ring buffer (LOST_CLOSES).
    lost_closes: HashMap<MapData, u64, SyscallRecord>,
    /// Bitmap of processes whose unknown fds are still captured (engines with IPC decoding).
    unknown_fds: Array<MapData, u64>,
    /// Bitmap of processes with verdicts in `fd_verdicts` (the kernel looks only for those).
    verdict_pids: Array<MapData, u64>,
    /// fexit on inet_csk_accept is attached: an accept without a socket address is not TCP.
    sock_hook: bool,
    /// Why fexit on inet_csk_accept could not be attached, when it could not.
    sock_hook_refused: Option<String>,
    /// The accept's exit finds the new fd's socket (offsets from the kernel's BTF).
    socket_walk: bool,
    /// Why reads take their arguments at their entry (None: at their exit).
    reads_at_entry: Option<String>,
    /// Why writes keep their entry programs, if they do.
    writes_at_entry: Option<String>,
    /// How exits load the saved registers and the transmit stamp (typed pointers or helpers).
    exit_loads: String,
    /// Processes whose sends/receives are captured whole, in chunks (see LARGE_CAPTURE).
    large_capture: HashMap<MapData, u32, u32>,
    counters: PerCpuArray<MapData, u64>,
    /// Programs this kernel refused (each with a fallback, logged at load).
    refused: Vec<&'static str>,
    /// The programs built for kernels with `bpf_loop` and attach cookies are loaded (false:
    /// those for older kernels, which read no attach cookie).
    cookies: bool,
    /// Tracepoint programs left unattached because this kernel's record layout lacks a field
    /// they read (exported as a counter; each was logged at load).
    unattached: u64,
    logger: Option<EbpfLogger<&'static dyn log::Log>>,
}

/// Sets or clears bit `n` of a bitmap map. Only the pipeline thread writes these maps; the
/// kernel programs only read them.
fn set_bit(map: &mut Array<MapData, u64>, n: u32, on: bool) -> Result<(), aya::maps::MapError> {
    let index = n >> 6;
    let bit = 1u64 << (n & 63);
    let word = map.get(&index, 0)?;
    map.set(index, if on { word | bit } else { word & !bit }, 0)
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, CaptureError> {
    ebpf.take_map(name).ok_or(CaptureError::Map {
        name,
        source: Box::new(aya::maps::MapError::InvalidName {
            name: name.to_string(),
        }),
    })
}

impl SocketProbes {
    pub(crate) fn load(config: CaptureConfig) -> Result<Self, CaptureError> {
        if config.capture_bytes as usize > MAX_CAPTURE_BYTES {
            return Err(CaptureError::Config(format!(
                "capture size {} exceeds the maximum of {MAX_CAPTURE_BYTES} bytes",
                config.capture_bytes
            )));
        }
        if !config.ring_buffer_bytes.is_power_of_two() || config.ring_buffer_bytes < 4096 {
            return Err(CaptureError::Config(format!(
                "ring buffer size {} must be a power of two of at least 4096",
                config.ring_buffer_bytes
            )));
        }
        raise_memlock_limit();
        // Everything the agent captures leaves the kernel through the ring buffer (5.8): below
        // it nothing would load, so say so before the verifier says something less clear.
        if matches!(
            aya::sys::is_map_supported(aya::maps::MapType::RingBuf),
            Ok(false)
        ) {
            return Err(CaptureError::KernelTooOld {
                release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_else(|_| "(unknown release)".into()),
            });
        }
        let tcp_offsets = Format::read("tcp", "tcp_probe")
            .and_then(|format| TcpProbeOffsets::from_format(&format))
            .inspect_err(|e| {
                warn!(
                    "{e}: tcp:tcp_probe is not attached, so a request's arrival is its first read, not its bytes' arrival on the wire"
                );
            })
            .ok();
        if tcp_offsets.is_some_and(|o| o.skaddr == 0) {
            warn!(
                "tcp:tcp_probe has no skaddr field here: TCP arrivals join connections by address only"
            );
        }
        // All zero when the program is not attached (it is then not loaded either).
        let t = tcp_offsets.unwrap_or_default();
        let pressure_bytes = inferscope_common::pressure_bytes(config.ring_buffer_bytes);
        let state_offsets = Format::read("sock", "inet_sock_set_state")
            .and_then(|format| tracefs::sock_state_offsets(&format))
            .inspect_err(|e| {
                warn!(
                    "{e}: sock:inet_sock_set_state is not attached, so a client that closes before a non-streamed response is written shows as complete"
                );
            })
            .ok();
        let [s_skaddr, s_old, s_new, s_sport, s_protocol] = state_offsets.unwrap_or_default();
        // The kernel counts the cap per window (LAUNCH_WINDOW_NS); 0 stays "no cap".
        let windows_per_s = (1_000_000_000 / inferscope_common::LAUNCH_WINDOW_NS) as u32;
        let launch_cap = config.gpu_launch_cap.div_ceil(windows_per_s);
        // Iovecs past the first eight need bpf_loop (5.17+): a write of more of them (gRPC's C
        // core, a frame header and its payload per iovec) is otherwise cut after the eighth.
        let loop_iovecs = aya::sys::is_helper_supported(
            aya::programs::ProgramType::TracePoint,
            aya::sys::BpfHelper::BPF_FUNC_loop,
        )
        .unwrap_or(false);
        if !loop_iovecs {
            warn!(
                "this kernel has no bpf_loop (5.17+): the programs built for older kernels are loaded; a sendmsg/writev of more than {} iovecs is captured up to the {}th (counted in kernel_payload_truncated), and an engine's IPC message or a TLS plaintext larger than one record ({MAX_CAPTURE_BYTES} bytes) is captured up to one record (counted in kernel_chunks_unsent)",
                inferscope_common::MAX_IOV,
                inferscope_common::MAX_IOV
            );
        }
        let embedded = if loop_iovecs {
            PROGRAM_OBJECT
        } else {
            LEGACY_OBJECT
        };
        let offsets = super::btf::kernel_offsets();
        let walk = accept_socket_walk(offsets.socket_walk);
        let w = walk.as_ref().copied().unwrap_or_default();
        // Set whenever the BTF has them: programs that read them are attached only where the
        // reads' or writes' own decision below allows.
        let a = offsets.exit_args.clone().unwrap_or_default();
        let args = args_at_exit(READ_ARGS_ENV, offsets.exit_args.clone());
        let xmit = args_at_exit(WRITE_ARGS_ENV, offsets.exit_args).and_then(|_| {
            offsets
                .xmit_stamp
                .map_err(|why| format!("{why}: no transmit stamp"))
        });
        let x = xmit.as_ref().copied().unwrap_or_default();
        let rdonly_cast = match std::env::var(KFUNCS_ENV) {
            Ok(v) if v == "off" => Err(format!("{KFUNCS_ENV}=off")),
            _ => offsets
                .rdonly_cast
                .ok_or_else(|| "this kernel has no bpf_rdonly_cast (6.2+)".to_string()),
        };
        // How exits find the saved registers and a write's transmit stamp, for the log.
        let loads = match &rdonly_cast {
            Ok(_) => "loaded through typed pointers (bpf_rdonly_cast)".to_string(),
            Err(why) => format!("read with helper calls: {why}"),
        };
        let object = super::kfunc::patch(embedded, rdonly_cast.as_ref().ok().copied())?;
        // The type ids tell the programs to load through typed pointers (0: the helpers).
        let (tcp_sock_type, pt_regs_type) = if rdonly_cast.is_ok() {
            (x.tcp_sock_type, a.pt_regs_type)
        } else {
            (0, 0)
        };
        let mut ebpf = EbpfLoader::new()
            .override_global("SOCK_WALK", &u32::from(walk.is_ok()), true)
            .override_global("SOCK_WALK_TASK_FILES", &w.task_files, true)
            .override_global("SOCK_WALK_FILES_FDT", &w.files_fdt, true)
            .override_global("SOCK_WALK_FDT_MAX_FDS", &w.fdt_max_fds, true)
            .override_global("SOCK_WALK_FDT_FD", &w.fdt_fd, true)
            .override_global("SOCK_WALK_FILE_PRIVATE_DATA", &w.file_private_data, true)
            .override_global("SOCK_WALK_SOCKET_SK", &w.socket_sk, true)
            .override_global("SOCK_WALK_SOCK_FAMILY", &w.sock_family, true)
            .override_global("SOCK_WALK_SOCK_PROTOCOL", &w.sock_protocol, true)
            .override_global("SOCK_WALK_MPTCP_FIRST", &w.mptcp_first, true)
            .override_global("EXIT_ARGS_TASK_PID", &a.task_pid, true)
            .override_global("EXIT_ARGS_TASK_TGID", &a.task_tgid, true)
            .override_global("EXIT_ARGS_REG0", &a.regs[0], true)
            .override_global("EXIT_ARGS_REG1", &a.regs[1], true)
            .override_global("EXIT_ARGS_REG2", &a.regs[2], true)
            .override_global("EXIT_ARGS_TASK_STACK", &a.task_stack, true)
            .override_global("EXIT_ARGS_PT_REGS_TYPE", &pt_regs_type, true)
            .override_global("XMIT_STAMP", &u32::from(xmit.is_ok()), true)
            .override_global("XMIT_BASE", &x.base, true)
            .override_global("XMIT_WRITE_SEQ", &x.write_seq, true)
            .override_global("XMIT_SND_NXT", &x.snd_nxt, true)
            .override_global("XMIT_WSTAMP", &x.wstamp_ns, true)
            .override_global("XMIT_TCP_SOCK_TYPE", &tcp_sock_type, true)
            .override_global("SOCK_STATE_SKADDR", &s_skaddr, true)
            .override_global("SOCK_STATE_OLDSTATE", &s_old, true)
            .override_global("SOCK_STATE_NEWSTATE", &s_new, true)
            .override_global("SOCK_STATE_SPORT", &s_sport, true)
            .override_global("SOCK_STATE_PROTOCOL", &s_protocol, true)
            .override_global("ACCEPT_PARAMS", &offsets.accept_params.unwrap_or(2), true)
            .override_global("CAPTURE_BYTES", &config.capture_bytes, true)
            .override_global("PRESSURE_BYTES", &pressure_bytes, true)
            .override_global("LAUNCH_CAP_PER_WINDOW", &launch_cap, true)
            .override_global("TCP_PROBE_DADDR", &t.daddr, true)
            .override_global("TCP_PROBE_SPORT", &t.sport, true)
            .override_global("TCP_PROBE_DPORT", &t.dport, true)
            .override_global("TCP_PROBE_FAMILY", &t.family, true)
            .override_global("TCP_PROBE_DATA_LEN", &t.data_len, true)
            .override_global("TCP_PROBE_SKADDR", &t.skaddr, true)
            .override_global("TCP_PROBE_IN_PLACE", &u32::from(t.in_place()), true)
            .map_max_entries("EVENTS", config.ring_buffer_bytes)
            .load(object.bytes())
            .map_err(|e| CaptureError::Load(Box::new(e)))?;

        // Both before exit_syscall is attached, so that no syscall finds a slot empty. The
        // record program is the second half of every syscall's exit (exit_syscall alone would
        // exceed the verifier's budget): without it nothing would be captured.
        install_tail_call(&mut ebpf, "exit_record", "RECORD_PROGRAM").map_err(|reason| {
            CaptureError::TailCall {
                program: "exit_record",
                reason,
            }
        })?;
        // Programs this kernel refused (the fallbacks taken are logged where each is decided).
        let mut refused: Vec<&'static str> = Vec::new();
        if loop_iovecs && let Err(e) = install_tail_call(&mut ebpf, "exit_chunks", "CHUNK_PROGRAM")
        {
            refused.push("exit_chunks");
            warn!(
                "the chunk program did not load ({e}): sends and receives of engine IPC and HTTP/2 are captured up to one record ({MAX_CAPTURE_BYTES} bytes), counted in kernel_chunks_unsent"
            );
        }
        attach_all(&mut ebpf, ATTACHMENTS)?;
        let mut unattached = 0;
        if tcp_offsets.is_some() {
            attach_tracepoint(&mut ebpf, ("tcp_probe", "tcp", "tcp_probe"))?;
        } else {
            unattached += 1;
        }
        if state_offsets.is_some() {
            attach_tracepoint(&mut ebpf, ("sock_state", "sock", "inet_sock_set_state"))?;
        } else {
            unattached += 1;
        }
        let sock_hook_refused = match attach_accept_hook(&mut ebpf, offsets.accept_params) {
            Ok(()) => None,
            Err(e) => {
                if e.starts_with("loading") {
                    refused.push("accepted_sock");
                }
                match &walk {
                    Ok(_) => info!(
                        "fexit on inet_csk_accept unavailable ({e}): an accepted connection's TCP socket is found from its fd at the accept (struct offsets from the kernel's BTF)"
                    ),
                    Err(why) => {
                        info!(
                            "fexit on inet_csk_accept unavailable ({e}), and {why}: an accepted connection's TCP socket is learnt at its first read (tcp:tcp_rcv_space_adjust)"
                        );
                        attach_read_sock_hook(&mut ebpf)?;
                    }
                }
                Some(e)
            }
        };
        let sock_hook = sock_hook_refused.is_none() || walk.is_ok();
        // Reads wait at their entry to learn their connection's socket where neither fexit nor
        // the walk gives it at the accept.
        let reads_learn_sock = sock_hook_refused.is_some() && walk.is_err();
        let reads_exit = args.as_ref().map_err(String::clone).and_then(|_| {
            if reads_learn_sock {
                return Err("reads learn their connection's socket at their entry".to_string());
            }
            load_all(&mut ebpf, READS_AT_EXIT, &mut refused)
        });
        let reads_at_entry = attach_at_exit_or_entry(
            &mut ebpf,
            reads_exit,
            READS_AT_EXIT,
            format!(
                "reads take their arguments at their exit, from the thread's saved registers ({loads})"
            ),
            READS_AT_ENTRY,
            &|why| {
                format!(
                    "reads take their arguments at their entry ({why}): one more program run per read"
                )
            },
        )?;
        let writes_exit = xmit.and_then(|_| load_all(&mut ebpf, WRITES_AT_EXIT, &mut refused));
        let writes_at_entry = attach_at_exit_or_entry(
            &mut ebpf,
            writes_exit,
            WRITES_AT_EXIT,
            format!(
                "writes take their arguments at their exit, from the thread's saved registers, and their time from their socket's transmit stamp ({loads})"
            ),
            WRITES_AT_ENTRY,
            &|why| {
                format!(
                    "writes take their arguments and time at their entry ({why}): one more program run per write"
                )
            },
        )?;
        // Engine scheduler uprobes are loaded now and attached per process when one is found.
        // tls_record is loaded below, where its failure is named as the record program's.
        for (name, program) in ebpf.programs_mut() {
            if name == TLS_RECORD_PROGRAM {
                continue;
            }
            if let Ok(uprobe) = <&mut UProbe>::try_from(program) {
                uprobe.load().map_err(|source| CaptureError::Attach {
                    program: "engine uprobe",
                    category: "uprobe",
                    tracepoint: "(load)",
                    source: Box::new(source),
                })?;
                debug!(program = name, "uprobe program loaded");
            }
        }
        // Before any TLS probe is attached (per process, later): the plaintext's record.
        install_tail_call(&mut ebpf, TLS_RECORD_PROGRAM, "TLS_RECORD_PROGRAM").map_err(
            |reason| CaptureError::TailCall {
                program: TLS_RECORD_PROGRAM,
                reason,
            },
        )?;
        super::verifier::log_headroom(&super::verifier::program_states(&ebpf, &refused));
        // Must come after loading (it looks up the programs' log map).
        let logger = match EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                debug!("eBPF logging unavailable: {e}");
                None
            }
        };

        let map_err = |name: &'static str| {
            move |source| CaptureError::Map {
                name,
                source: Box::new(source),
            }
        };
        let events =
            RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?).map_err(map_err("EVENTS"))?;
        let targets =
            Array::try_from(take_map(&mut ebpf, "TARGETS")?).map_err(map_err("TARGETS"))?;
        let ports = Array::try_from(take_map(&mut ebpf, "PORTS")?).map_err(map_err("PORTS"))?;
        let fd_verdicts =
            HashMap::try_from(take_map(&mut ebpf, "FD_VERDICT")?).map_err(map_err("FD_VERDICT"))?;
        let keep_whole =
            HashMap::try_from(take_map(&mut ebpf, "KEEP_WHOLE")?).map_err(map_err("KEEP_WHOLE"))?;
        let process_templates = HashMap::try_from(take_map(&mut ebpf, "PROCESS_TEMPLATES")?)
            .map_err(map_err("PROCESS_TEMPLATES"))?;
        let stream_templates = Array::try_from(take_map(&mut ebpf, "STREAM_TEMPLATES")?)
            .map_err(map_err("STREAM_TEMPLATES"))?;
        let large_capture = HashMap::try_from(take_map(&mut ebpf, "LARGE_CAPTURE")?)
            .map_err(map_err("LARGE_CAPTURE"))?;
        let counters =
            PerCpuArray::try_from(take_map(&mut ebpf, "COUNTERS")?).map_err(map_err("COUNTERS"))?;
        let conns = HashMap::try_from(take_map(&mut ebpf, "CONNS")?).map_err(map_err("CONNS"))?;
        let lost_closes = HashMap::try_from(take_map(&mut ebpf, "LOST_CLOSES")?)
            .map_err(map_err("LOST_CLOSES"))?;
        let unknown_fds =
            Array::try_from(take_map(&mut ebpf, "UNKNOWN_FDS")?).map_err(map_err("UNKNOWN_FDS"))?;
        let verdict_pids = Array::try_from(take_map(&mut ebpf, "VERDICT_PIDS")?)
            .map_err(map_err("VERDICT_PIDS"))?;
        let user_configs =
            Array::try_from(take_map(&mut ebpf, "USER_PROBES")?).map_err(map_err("USER_PROBES"))?;
        Ok(Self {
            ebpf,
            uprobe_links: std::collections::HashMap::new(),
            user_links: std::collections::HashMap::new(),
            user_configs,
            events,
            targets,
            ports,
            fd_verdicts,
            keep_whole,
            process_templates,
            template_version: 0,
            stream_templates,
            conns,
            lost_closes,
            unknown_fds,
            verdict_pids,
            sock_hook,
            sock_hook_refused,
            socket_walk: walk.is_ok(),
            reads_at_entry,
            writes_at_entry,
            exit_loads: loads,
            large_capture,
            counters,
            refused,
            cookies: loop_iovecs,
            unattached,
            logger,
        })
    }

    pub(crate) fn events(&mut self) -> &mut RingBuf<MapData> {
        &mut self.events
    }

    /// Close records the ring buffer had no room for, taken out of the kernel's map (as the
    /// bytes of a ring record). Read them only once the ring is read empty: every record of
    /// their connection the kernel kept came before them.
    pub(crate) fn take_lost_closes(&mut self) -> Vec<Vec<u8>> {
        let ids: Vec<u64> = self.lost_closes.keys().filter_map(Result::ok).collect();
        let mut closes = Vec::with_capacity(ids.len());
        for id in ids {
            if let Ok(record) = self.lost_closes.get(&id, 0) {
                // SAFETY: SyscallRecord is aya::Pod (repr(C), its padding spelled out as
                // fields): its bytes are initialised and are exactly what the kernel would have
                // put in the ring buffer.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        (&raw const record).cast::<u8>(),
                        std::mem::size_of::<SyscallRecord>(),
                    )
                };
                closes.push(bytes.to_vec());
            }
            let _ = self.lost_closes.remove(&id);
        }
        closes
    }

    /// Token events the kernel still holds in connections' batches (a stream that has not
    /// written for less than the batch span), as the bytes of the ring records they would have
    /// gone out in. For the agent's last drain: the kernel may be adding to a batch as it is
    /// read, so an event being added may be missing or its size or time wrong.
    pub(crate) fn waiting_token_batches(&self) -> Vec<Vec<u8>> {
        self.stream_templates
            .iter()
            .filter_map(Result::ok)
            .filter_map(|template| {
                let batch = template.batch;
                let count = usize::from(batch.header.count);
                if count == 0 || count > TOKEN_BATCH_MAX {
                    return None;
                }
                let len = std::mem::size_of::<TokenBatchRecord>()
                    + count * std::mem::size_of::<TokenBatchEntry>();
                // SAFETY: TokenBatch is aya::Pod (repr(C), no padding between its header and
                // entries, asserted in inferscope_common); `len` is within its size.
                let bytes =
                    unsafe { std::slice::from_raw_parts((&raw const batch).cast::<u8>(), len) };
                Some(bytes.to_vec())
            })
            .collect()
    }

    pub(crate) fn events_fd(&self) -> RawFd {
        self.events.as_fd().as_raw_fd()
    }

    pub(crate) fn trace_process(&mut self, tgid: u32) {
        if let Err(e) = set_bit(&mut self.targets, tgid, true) {
            warn!("cannot trace pid {tgid}: {e}");
        }
    }

    pub(crate) fn untrace_process(&mut self, tgid: u32) {
        let _ = set_bit(&mut self.targets, tgid, false);
        let _ = set_bit(&mut self.unknown_fds, tgid, false);
        let _ = set_bit(&mut self.verdict_pids, tgid, false);
        let _ = self.process_templates.remove(&tgid);
        // Set by user space or by the kernel itself (a read that opened with HTTP/2's preface).
        let _ = self.large_capture.remove(&tgid);
    }

    /// Whether fds of `tgid` the kernel does not know as connections are captured too (for
    /// engines whose IPC the agent decodes).
    pub(crate) fn capture_unknown_fds(&mut self, tgid: u32, on: bool) {
        if let Err(e) = set_bit(&mut self.unknown_fds, tgid, on) {
            warn!("cannot set IPC capture for pid {tgid}: {e}");
        }
    }

    /// Registers a connection that predates the agent on `fd`, unless the kernel already knows
    /// what the fd holds (an accept seen meanwhile wins). Whether it was added.
    pub(crate) fn register_preexisting(&mut self, tgid: u32, fd: i32, entry: ConnEntry) -> bool {
        const BPF_NOEXIST: u64 = 1;
        self.conns
            .insert(fd_key(tgid, fd), entry, BPF_NOEXIST)
            .is_ok()
    }

    /// Drops a registration made by [`Self::register_preexisting`] if it still holds `id`.
    pub(crate) fn unregister_preexisting(&mut self, tgid: u32, fd: i32, id: u64) {
        let key = fd_key(tgid, fd);
        if self.conns.get(&key, 0).is_ok_and(|e| e.id == id) {
            let _ = self.conns.remove(&key);
        }
    }

    /// fexit on inet_csk_accept is attached: accepted fds are known TCP or known not.
    pub(crate) fn sock_hook(&self) -> bool {
        self.sock_hook
    }

    /// Why fexit on inet_csk_accept is not attached (None: it is).
    pub(crate) fn sock_hook_refused(&self) -> Option<&str> {
        self.sock_hook_refused.as_deref()
    }

    /// Whether the accept's exit finds a new connection's socket from its fd, where fexit is
    /// refused (else its first read learns it).
    pub(crate) fn socket_walk(&self) -> bool {
        self.socket_walk
    }

    /// Why reads need an entry program here (None: their exits take the arguments from the
    /// thread's saved registers).
    pub(crate) fn reads_at_entry_reason(&self) -> Option<&str> {
        self.reads_at_entry.as_deref()
    }

    /// Why writes keep their entry programs (None: they take their arguments at their exit).
    pub(crate) fn writes_at_entry_reason(&self) -> Option<&str> {
        self.writes_at_entry.as_deref()
    }

    /// Every program of the object on this kernel: loaded, refused or unused, and the
    /// instructions its verifier walked.
    pub(crate) fn programs(&self) -> Vec<super::verifier::ProgramState> {
        super::verifier::program_states(&self.ebpf, &self.refused)
    }

    /// How exits that take their arguments load the saved registers and the transmit stamp:
    /// through typed pointers (`bpf_rdonly_cast`) or with helper calls, and why.
    pub(crate) fn exit_loads(&self) -> &str {
        &self.exit_loads
    }

    pub(crate) fn watch_port(&mut self, port: u16) {
        if let Err(e) = set_bit(&mut self.ports, u32::from(port), true) {
            warn!("cannot watch port {port}: {e}");
        }
    }

    pub(crate) fn unwatch_port(&mut self, port: u16) {
        let _ = set_bit(&mut self.ports, u32::from(port), false);
    }

    /// Captures up to `bytes` of each send/receive of `tgid` (in chunk records beyond one
    /// record's worth), for engines whose IPC messages are decoded whole; 0 stops it.
    pub(crate) fn capture_large(&mut self, tgid: u32, bytes: u32) {
        if bytes == 0 {
            let _ = self.large_capture.remove(&tgid);
        } else if let Err(e) = self.large_capture.insert(tgid, bytes, 0) {
            warn!("pid {tgid}: cannot raise its capture size for engine IPC: {e}");
        }
    }

    /// Stops payload capture for the connection generation `conn_gen` of one fd; a connection
    /// that reuses the fd number later is captured again.
    pub(crate) fn ignore_connection(&mut self, tgid: u32, fd: i32, conn_gen: u64) {
        let _ = self.fd_verdicts.insert(fd_key(tgid, fd), conn_gen, 0);
        // After the verdict: the kernel looks for verdicts of this process from now on.
        if let Err(e) = set_bit(&mut self.verdict_pids, tgid, true) {
            warn!("cannot record a verdict for pid {tgid}: {e}");
        }
    }

    /// The connection `conn_gen` on `fd` carries engine IPC: the kernel's adaptive capture must
    /// not cut its writes behind a filling ring buffer (a cut message is a lost message).
    pub(crate) fn keep_whole(&mut self, tgid: u32, fd: i32, conn_gen: u64) {
        if let Err(e) = self.keep_whole.insert(fd_key(tgid, fd), conn_gen, 0) {
            warn!("pid {tgid}: cannot exempt IPC connection on fd {fd} from cut captures: {e}");
        }
    }

    /// Installs process `tgid`'s token event template: each of its connections takes it at
    /// its next response head, and then sends writes that are one whole token event of it as
    /// payload-free token records.
    pub(crate) fn set_process_template(&mut self, tgid: u32, template: &StreamTemplate) {
        self.template_version = self.template_version.wrapping_add(1);
        let template = StreamTemplate {
            version: self.template_version,
            ..*template
        };
        if let Err(e) = self.process_templates.insert(tgid, template, 0) {
            debug!("pid {tgid}: cannot install its token template: {e}");
        }
    }

    /// Kernel-side counters summed over CPUs, and the programs this kernel could not take.
    pub(crate) fn counters(&self) -> Vec<(inferscope_model::Counter, u64)> {
        Counter::ALL
            .iter()
            .map(|&c| (inferscope_model::counters::kernel(c), self.counter(c)))
            .chain([(
                inferscope_model::Counter::KernelTracepointsUnattached,
                self.unattached,
            )])
            .collect()
    }

    /// Attaches the engine uprobe `program` at `file_offset` of `object`, for process `tgid`
    /// only, with `cookie` for the program to read.
    pub(crate) fn attach_uprobe(
        &mut self,
        program: &str,
        object: &std::path::Path,
        file_offset: u64,
        tgid: u32,
        cookie: u64,
    ) -> Result<(), String> {
        let attached = self.link_uprobe(program, object, file_offset, tgid, cookie)?;
        self.uprobe_links.entry(tgid).or_default().push(attached);
        Ok(())
    }

    /// Attaches a return program and its entry program at one function, the return first: an
    /// entry whose return never runs would leave call state behind on every call. Neither
    /// stays attached if the other fails.
    pub(crate) fn attach_uprobe_pair(
        &mut self,
        (entry, ret): (&str, &str),
        object: &std::path::Path,
        file_offset: u64,
        tgid: u32,
        cookie: u64,
    ) -> Result<(), String> {
        let (ret_name, ret_link) = self.link_uprobe(ret, object, file_offset, tgid, cookie)?;
        match self.link_uprobe(entry, object, file_offset, tgid, cookie) {
            Ok(entry_attached) => {
                let links = self.uprobe_links.entry(tgid).or_default();
                links.push((ret_name, ret_link));
                links.push(entry_attached);
                Ok(())
            }
            Err(e) => {
                if let Some(Ok(uprobe)) = self
                    .ebpf
                    .program_mut(&ret_name)
                    .map(<&mut UProbe>::try_from)
                {
                    let _ = uprobe.detach(ret_link);
                }
                Err(e)
            }
        }
    }

    /// Attaches `program` at `file_offset` of `object` for process `tgid` only, with `cookie`;
    /// returns the program attached and its link. Where the programs built for kernels
    /// without attach cookies run (before 5.15), a program built once per cookie
    /// (`<program>_c<cookie>`) is attached instead, and one that would read a non-zero cookie is
    /// refused (it would read 0).
    fn link_uprobe(
        &mut self,
        program: &str,
        object: &std::path::Path,
        file_offset: u64,
        tgid: u32,
        cookie: u64,
    ) -> Result<(String, UProbeLinkId), String> {
        let pid = std::num::NonZeroU32::new(tgid).ok_or("pid 0")?;
        let per_cookie = format!("{program}_c{cookie}");
        let (name, cookie) = if !self.cookies && self.ebpf.program(&per_cookie).is_some() {
            (per_cookie, None)
        } else if !self.cookies && cookie != 0 {
            return Err(format!(
                "{program} needs an attach cookie ({cookie}), which this kernel does not have (5.15+)"
            ));
        } else {
            (program.to_owned(), self.cookies.then_some(cookie))
        };
        let uprobe: &mut UProbe = self
            .ebpf
            .program_mut(&name)
            .ok_or_else(|| format!("no eBPF program {name}"))?
            .try_into()
            .map_err(|e| format!("{name} is not a uprobe: {e}"))?;
        let link = uprobe
            .attach(
                UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(file_offset),
                    cookie,
                },
                object,
                UProbeScope::OneProcess(pid),
            )
            .map_err(|e| e.to_string())?;
        Ok((name, link))
    }

    /// Tells the user-defined probe program how probe `index` reads its value.
    pub(crate) fn set_user_probe(
        &mut self,
        index: u32,
        config: UserProbeConfig,
    ) -> Result<(), String> {
        self.user_configs
            .set(index, config, 0)
            .map_err(|e| format!("writing probe configuration {index}: {e}"))
    }

    /// Attaches user-defined probe `index` (its attach cookie) at `file_offset` of `object`, for
    /// process `tgid` only; `at_return` picks the return-probe program.
    pub(crate) fn attach_user_probe(
        &mut self,
        index: u32,
        at_return: bool,
        object: &std::path::Path,
        file_offset: u64,
        tgid: u32,
    ) -> Result<(), String> {
        let program: &'static str = if at_return {
            "user_probe_ret"
        } else {
            "user_probe"
        };
        let (_, link) = self.link_uprobe(program, object, file_offset, tgid, u64::from(index))?;
        self.user_links
            .entry((tgid, index))
            .or_default()
            .push((program, link));
        Ok(())
    }

    /// Detaches user-defined probe `index` from `tgid` (it keeps failing).
    pub(crate) fn detach_user_probe(&mut self, tgid: u32, index: u32) {
        for (program, link) in self.user_links.remove(&(tgid, index)).unwrap_or_default() {
            if let Some(Ok(uprobe)) = self.ebpf.program_mut(program).map(<&mut UProbe>::try_from) {
                let _ = uprobe.detach(link);
            }
        }
    }

    /// Removes the uprobes of `programs` attached for `tgid`, keeping its others.
    pub(crate) fn detach_uprobe_programs(&mut self, tgid: u32, programs: &[&str]) {
        let Some(links) = self.uprobe_links.get_mut(&tgid) else {
            return;
        };
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(links)
            .into_iter()
            .partition(|(program, _)| programs.contains(&program.as_str()));
        *links = kept;
        for (program, link) in gone {
            if let Some(Ok(uprobe)) = self.ebpf.program_mut(&program).map(<&mut UProbe>::try_from) {
                let _ = uprobe.detach(link);
            }
        }
    }

    /// Removes every uprobe attached for `tgid` (the process went away or is no longer traced).
    pub(crate) fn detach_uprobes(&mut self, tgid: u32) {
        let user: Vec<u32> = self
            .user_links
            .keys()
            .filter(|(t, _)| *t == tgid)
            .map(|(_, i)| *i)
            .collect();
        for index in user {
            self.detach_user_probe(tgid, index);
        }
        for (program, link) in self.uprobe_links.remove(&tgid).unwrap_or_default() {
            if let Some(Ok(uprobe)) = self.ebpf.program_mut(&program).map(<&mut UProbe>::try_from) {
                let _ = uprobe.detach(link);
            }
        }
    }

    /// Whether this kernel lets the agent attach a uprobe (the `uprobe` PMU wants
    /// CAP_SYS_ADMIN): one of the loaded uprobe programs is attached to libc's `getpid` in this
    /// process only, and detached at once. Err says why not.
    pub(crate) fn uprobe_self_test(&mut self) -> Result<(), String> {
        let own = std::process::id();
        let libc_path = crate::capture::process::procfs::mapped_files(own)
            .into_iter()
            .find(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("libc.so"))
            })
            .ok_or("libc is not mapped in this process")?;
        let symbols =
            crate::capture::elf::symbols::ElfSymbols::load(std::path::Path::new(&libc_path))
                .map_err(|e| e.to_string())?;
        let offset = symbols
            .resolve("getpid")
            .first()
            .map(|s| s.file_offset)
            .ok_or_else(|| format!("getpid not found in {libc_path}"))?;
        let program = self
            .ebpf
            .programs()
            // Not the tail-called TLS record program: attached, it would send the hand-over
            // map's stale contents on every getpid.
            .find(|(name, p)| {
                matches!(p, aya::programs::Program::UProbe(_)) && *name != TLS_RECORD_PROGRAM
            })
            .map(|(name, _)| name.to_owned())
            .ok_or("no uprobe program in the embedded object")?;
        let (program, link) =
            self.link_uprobe(&program, std::path::Path::new(&libc_path), offset, own, 0)?;
        if let Some(Ok(uprobe)) = self.ebpf.program_mut(&program).map(<&mut UProbe>::try_from) {
            let _ = uprobe.detach(link);
        }
        Ok(())
    }

    /// One kernel counter, summed over CPUs.
    pub(crate) fn counter(&self, counter: Counter) -> u64 {
        self.counters
            .get(&(counter as u32), 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }

    /// Forwards eBPF-side log lines into the agent's log.
    pub(crate) fn flush_logs(&mut self) {
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
    }
}

const _: () = assert!(COUNTER_SLOTS as usize >= Counter::ALL.len());

/// Loads and attaches fexit on inet_csk_accept (needs BTF and BPF trampolines).
fn attach_accept_hook(ebpf: &mut Ebpf, params: Option<u32>) -> Result<(), String> {
    if !matches!(params, Some(2 | 4)) {
        return Err(format!(
            "inet_csk_accept takes {} parameters here, where the program knows 2 or 4",
            params.map_or("unknown".to_string(), |n| n.to_string())
        ));
    }
    let btf = Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {e}"))?;
    let program: &mut FExit = ebpf
        .program_mut("accepted_sock")
        .ok_or("no accepted_sock program")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    program
        .load("inet_csk_accept", &btf)
        .map_err(|e| format!("loading: {e}"))?;
    program.attach().map_err(|e| format!("attaching: {e}"))?;
    Ok(())
}

/// Set to `first-read`, the accept's exit does not look for a new connection's socket from its
/// fd: its first read learns it, as on a kernel without BTF (a workaround should the walk
/// misread an unusual kernel; the tests run both ways).
const ACCEPT_SOCKET_ENV: &str = "INFERSCOPE_ACCEPT_SOCKET";

/// The offsets for the accept's socket walk (`from_btf`), or why it is off.
fn accept_socket_walk(from_btf: Result<SocketWalk, String>) -> Result<SocketWalk, String> {
    if std::env::var(ACCEPT_SOCKET_ENV).is_ok_and(|v| v == "first-read") {
        return Err(format!("{ACCEPT_SOCKET_ENV}=first-read"));
    }
    from_btf
}

/// Without fexit, tcp:tcp_rcv_space_adjust (in the reading thread, on every TCP read of the
/// host) names the socket a connection's first read reads; it costs every TCP read a program
/// run, so it is attached only then.
fn attach_read_sock_hook(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    attach_tracepoint(ebpf, ("rcv_space_adjust", "tcp", "tcp_rcv_space_adjust"))
}

/// Set to `entry` to have entry programs save every read's arguments even where their exits
/// can take them from the registers (a kernel whose verifier or registers misbehave; A/B
/// measurements).
const READ_ARGS_ENV: &str = "INFERSCOPE_READ_ARGS";

/// The same for writes: `entry` stamps every write at its entry again.
const WRITE_ARGS_ENV: &str = "INFERSCOPE_WRITE_ARGS";

/// Set to `off` to have exits read the saved registers and the transmit stamp with helper
/// calls, as on a kernel without `bpf_rdonly_cast` (before 6.2), instead of loading them through
/// typed pointers (a verifier that refuses the kfunc; A/B measurements).
const KFUNCS_ENV: &str = "INFERSCOPE_KFUNCS";

/// Where an exit finds its call's arguments and thread ids (`from_btf`), or why it cannot
/// (`env` set to `entry`, a kernel without bpf_task_pt_regs or BTF).
fn args_at_exit(env: &str, from_btf: Result<ExitArgs, String>) -> Result<ExitArgs, String> {
    if std::env::var(env).is_ok_and(|v| v == "entry") {
        return Err(format!("{env}=entry"));
    }
    let helper = aya::sys::is_helper_supported(
        aya::programs::ProgramType::TracePoint,
        aya::sys::BpfHelper::BPF_FUNC_task_pt_regs,
    );
    if !helper.unwrap_or(false) {
        return Err("this kernel has no bpf_task_pt_regs (5.15+)".to_string());
    }
    from_btf
}

/// Loads (once each) the exit programs that take their arguments from the registers, or says
/// why they cannot be used (then none of them is attached).
fn load_all(
    ebpf: &mut Ebpf,
    programs: &[(&'static str, &str, &str)],
    refused: &mut Vec<&'static str>,
) -> Result<(), String> {
    for &(program, _, _) in programs {
        let prog: &mut TracePoint = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("{program} is missing from the object"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| {
                refused.push(program);
                format!("the kernel refused {program}: {e}")
            })?;
        }
    }
    Ok(())
}

/// Loads (once each) and attaches `attachments`.
fn attach_all(
    ebpf: &mut Ebpf,
    attachments: &[(&'static str, &'static str, &'static str)],
) -> Result<(), CaptureError> {
    for &(program, category, tracepoint) in attachments {
        let attach_err = |source| CaptureError::Attach {
            program,
            category,
            tracepoint,
            source: Box::new(source),
        };
        let prog: &mut TracePoint = ebpf
            .program_mut(program)
            .ok_or(CaptureError::MissingProgram { name: program })?
            .try_into()
            .map_err(attach_err)?;
        if prog.fd().is_err() {
            prog.load().map_err(attach_err)?;
        }
        prog.attach(category, tracepoint).map_err(attach_err)?;
    }
    Ok(())
}

/// Tracepoint attachments: (program, category, tracepoint).
type Attachments = [(&'static str, &'static str, &'static str)];

/// A syscall's programs at its exit (`at_exit`, logging `exit_line`) where `exit_loaded` (its
/// exit programs loaded, else why not) allows, else at its entry (`at_entry`, logging
/// `entry_line` of why not): returns why not at the exit, for `check` and the counters.
fn attach_at_exit_or_entry(
    ebpf: &mut Ebpf,
    exit_loaded: Result<(), String>,
    at_exit: &Attachments,
    exit_line: String,
    at_entry: &Attachments,
    entry_line: &dyn Fn(&str) -> String,
) -> Result<Option<String>, CaptureError> {
    match exit_loaded {
        Ok(()) => {
            info!("{exit_line}");
            attach_all(ebpf, at_exit)?;
            Ok(None)
        }
        Err(why) => {
            info!("{}", entry_line(&why));
            attach_all(ebpf, at_entry)?;
            Ok(Some(why))
        }
    }
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    attachment: (&'static str, &'static str, &'static str),
) -> Result<(), CaptureError> {
    attach_all(ebpf, &[attachment])
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; raising it is harmless on newer ones.
fn raise_memlock_limit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        debug!("setrlimit(RLIMIT_MEMLOCK) failed; fine on kernels >= 5.11");
    }
}

impl inferscope_model::PerProcess for SocketProbes {
    fn process_gone(&mut self, tgid: u32) {
        self.untrace_process(tgid);
        self.capture_large(tgid, 0);
        self.detach_uprobes(tgid);
    }
}
