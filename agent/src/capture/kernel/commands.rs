//! What the later stages want of the kernel side, as values: correlate and routing decide
//! (stop copying a connection, take a process's sends whole, install a token template), and
//! the pipeline applies the list with [`SocketProbes::apply`] once per drain, so no stage past
//! capture acts on the kernel itself.
use inferscope_common::StreamTemplate;

use super::probes::SocketProbes;

/// Bytes of one send/receive captured for processes whose engine IPC is decoded (vLLM's largest
/// message is a new request with its prompt's token ids, up to ~3 bytes a token, and libzmq
/// batches queued messages into one send) and for HTTP/2 servers (grpcio reads up to 64 KiB at
/// once; a read cut short loses the connection's framing and HPACK state).
pub(crate) const LARGE_CAPTURE_BYTES: u32 =
    (inferscope_common::MAX_CHUNKS * inferscope_common::MAX_CAPTURE_BYTES) as u32;

#[derive(Debug, Clone)]
pub(crate) enum KernelCommand {
    /// Stop copying payloads of this connection generation of the fd (not HTTP, or its
    /// framing lost for good).
    Ignore { tgid: u32, fd: i32, conn_gen: u64 },
    /// The connection carries engine IPC: never cut its writes behind a filling ring.
    KeepWhole { tgid: u32, fd: i32, conn_gen: u64 },
    /// Capture up to `bytes` of each send/receive of the process (engine IPC, HTTP/2 servers).
    CaptureLarge { tgid: u32, bytes: u32 },
    /// The process's token event template, for the kernel to summarise its token writes.
    SetTemplate {
        tgid: u32,
        template: Box<StreamTemplate>,
    },
    /// Stop tracing the process (left to discovery's next scan).
    Untrace { tgid: u32 },
}

impl SocketProbes {
    /// Carries out `commands`, in order.
    pub(crate) fn apply(&mut self, commands: Vec<KernelCommand>) {
        for command in commands {
            match command {
                KernelCommand::Ignore { tgid, fd, conn_gen } => {
                    self.ignore_connection(tgid, fd, conn_gen)
                }
                KernelCommand::KeepWhole { tgid, fd, conn_gen } => {
                    self.keep_whole(tgid, fd, conn_gen)
                }
                KernelCommand::CaptureLarge { tgid, bytes } => self.capture_large(tgid, bytes),
                KernelCommand::SetTemplate { tgid, template } => {
                    self.set_process_template(tgid, &template)
                }
                KernelCommand::Untrace { tgid } => self.untrace_process(tgid),
            }
        }
    }
}
