//! The few struct member offsets the kernel programs need to find an accepted connection's
//! socket from its fd (task → files → fd table → file → socket → sock) where fexit is refused,
//! read from the kernel's own type information (`/sys/kernel/btf/vmlinux`): those structs
//! change between releases and configurations, so no offset is compiled in. A minimal reader
//! of the BTF format (header, type section, string section): it walks every type record once
//! and answers member offsets by struct and member name, through anonymous structs and unions.
//! The bytes come from a file: every length and offset is checked, nothing panics.

/// The kernel's BTF, as sysfs exposes it.
pub(crate) const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
/// Kinds past this are unknown to this reader (their record length too): it stops there.
const KIND_MAX: u32 = 19;

/// How deep anonymous members nest before the reader gives up (the kernel's go 3 deep).
const MAX_NESTING: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    #[error("not BTF (magic {0:#06x}): the kernel's type information is unreadable")]
    Magic(u16),
    #[error("BTF is cut short: its {0} runs past the end of the data")]
    Truncated(&'static str),
    #[error("BTF is big-endian or another version than 1")]
    Unsupported,
    #[error("BTF has a type of kind {kind} (type {id}) this reader does not know")]
    UnknownKind { kind: u32, id: usize },
}

/// One type record: what member lookups need of it.
#[derive(Debug, Clone, Copy)]
struct Type {
    kind: u32,
    name_off: u32,
    /// The referenced type (modifiers, typedefs).
    size_or_type: u32,
    vlen: u32,
    kind_flag: bool,
    /// Offset of the record's extra data (members) in the type section.
    extra: usize,
}

/// The parsed type and string sections.
pub struct Btf<'a> {
    types_section: &'a [u8],
    strings: &'a [u8],
    /// Type id `i` is `types[i - 1]` (id 0 is void).
    types: Vec<Type>,
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn section<'a>(
    data: &'a [u8],
    start: usize,
    len: usize,
    name: &'static str,
) -> Result<&'a [u8], BtfError> {
    start
        .checked_add(len)
        .and_then(|end| data.get(start..end))
        .ok_or(BtfError::Truncated(name))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        let magic = u16_at(data, 0).ok_or(BtfError::Truncated("header"))?;
        if magic != MAGIC {
            return Err(BtfError::Magic(magic));
        }
        if data.get(2) != Some(&1) {
            return Err(BtfError::Unsupported);
        }
        let field = |at| {
            u32_at(data, at)
                .map(|v| v as usize)
                .ok_or(BtfError::Truncated("header"))
        };
        let header_len = field(4)?.max(HEADER_LEN);
        let (type_off, type_len) = (field(8)?, field(12)?);
        let (str_off, str_len) = (field(16)?, field(20)?);
        let types_section = section(
            data,
            header_len.saturating_add(type_off),
            type_len,
            "type section",
        )?;
        let strings = section(
            data,
            header_len.saturating_add(str_off),
            str_len,
            "string section",
        )?;
        let mut types = Vec::new();
        let mut at = 0;
        while at < types_section.len() {
            let word = |i: usize| {
                u32_at(types_section, at + 4 * i).ok_or(BtfError::Truncated("type section"))
            };
            let (name_off, info, size_or_type) = (word(0)?, word(1)?, word(2)?);
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let extra = at + 12;
            let extra_len = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen as usize,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen as usize,
                k if k > KIND_MAX || k == 0 => {
                    return Err(BtfError::UnknownKind {
                        kind: k,
                        id: types.len() + 1,
                    });
                }
                _ => 0,
            };
            types.push(Type {
                kind,
                name_off,
                size_or_type,
                vlen,
                kind_flag: info >> 31 == 1,
                extra,
            });
            at = extra + extra_len;
        }
        if at > types_section.len() {
            return Err(BtfError::Truncated("type section"));
        }
        Ok(Self {
            types_section,
            strings,
            types,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    /// The struct or union `id` names once typedefs and modifiers are peeled off.
    fn composite(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..MAX_NESTING {
            let ty = self.get(id)?;
            match ty.kind {
                KIND_STRUCT | KIND_UNION => return Some(ty),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.size_or_type;
                }
                _ => return None,
            }
        }
        None
    }

    /// Byte offset of member `member` of `ty`, looking into anonymous members.
    fn member_in(&self, ty: &Type, member: &str, depth: usize) -> Option<u32> {
        if depth > MAX_NESTING {
            return None;
        }
        for i in 0..ty.vlen as usize {
            let at = ty.extra + 12 * i;
            let name_off = u32_at(self.types_section, at)?;
            let member_type = u32_at(self.types_section, at + 4)?;
            let raw = u32_at(self.types_section, at + 8)?;
            // With kind_flag the top 8 bits are a bitfield's size and the rest its bit offset.
            let bits = if ty.kind_flag { raw & 0x00ff_ffff } else { raw };
            if name_off == 0 {
                if let Some(inner) = self.composite(member_type)
                    && let Some(offset) = self.member_in(inner, member, depth + 1)
                {
                    return (bits % 8 == 0)
                        .then(|| (bits / 8).checked_add(offset))
                        .flatten();
                }
            } else if self.name(name_off) == member.as_bytes() {
                return (bits % 8 == 0).then_some(bits / 8);
            }
        }
        None
    }

    /// Byte offset of member `member` in `struct name` (its full definition, not a forward
    /// declaration), or None.
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        self.types
            .iter()
            .filter(|ty| ty.kind == KIND_STRUCT && ty.vlen > 0)
            .filter(|ty| self.name(ty.name_off) == name.as_bytes())
            .find_map(|ty| self.member_in(ty, member, 0))
    }

    /// The type id of `struct name` (its full definition, not a forward declaration).
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        self.id_of(name, |ty| ty.kind == KIND_STRUCT && ty.vlen > 0)
    }

    /// The type id of function `name` (a kernel function the BTF describes, kfuncs among them).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.id_of(name, |ty| ty.kind == KIND_FUNC)
    }

    /// How many parameters kernel function `name` takes (from its prototype).
    pub fn func_params(&self, name: &str) -> Option<u32> {
        let proto = self.get(self.get(self.func_id(name)?)?.size_or_type)?;
        (proto.kind == KIND_FUNC_PROTO).then_some(proto.vlen)
    }

    fn id_of(&self, name: &str, wanted: impl Fn(&Type) -> bool) -> Option<u32> {
        let index = self
            .types
            .iter()
            .position(|ty| wanted(ty) && self.name(ty.name_off) == name.as_bytes())?;
        u32::try_from(index + 1).ok()
    }
}

/// Where each pointer of the walk from the current task to an fd's socket sits, and the
/// socket's address family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketWalk {
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
    pub sock_family: u32,
    /// `sock.sk_protocol` and `mptcp_sock.first` (an MPTCP connection's first subflow), or 0
    /// where the kernel has no MPTCP (every IPv4/IPv6 stream socket is then TCP; before 5.6,
    /// which has no MPTCP, `sk_protocol` was a bitfield).
    pub sock_protocol: u32,
    pub mptcp_first: u32,
}

impl SocketWalk {
    /// The offsets from `btf`, or the first (struct, member) it lacks.
    pub fn from_btf(btf: &Btf<'_>) -> Result<Self, (&'static str, &'static str)> {
        let offset = |s: &'static str, m: &'static str| btf.member_offset(s, m).ok_or((s, m));
        let mptcp = match btf.member_offset("mptcp_sock", "first") {
            Some(first) => Some((offset("sock", "sk_protocol")?, first)),
            None => None,
        };
        Ok(Self {
            task_files: offset("task_struct", "files")?,
            files_fdt: offset("files_struct", "fdt")?,
            fdt_max_fds: offset("fdtable", "max_fds")?,
            fdt_fd: offset("fdtable", "fd")?,
            file_private_data: offset("file", "private_data")?,
            socket_sk: offset("socket", "sk")?,
            sock_family: offset("sock_common", "skc_family")?,
            sock_protocol: mptcp.map_or(0, |(protocol, _)| protocol),
            mptcp_first: mptcp.map_or(0, |(_, first)| first),
        })
    }
}

/// Where the current task keeps its ids and its saved user registers keep a syscall's first
/// three arguments: a read's exit takes its arguments there instead of from an entry program
/// (see the eBPF crate's `socket/args.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitArgs {
    pub task_pid: u32,
    pub task_tgid: u32,
    /// Offsets in `struct pt_regs` of arguments 0, 1 and 2 as they stand at the syscall's exit.
    pub regs: [u32; 3],
    /// `task_struct.stack` (the kernel stack, whose top holds the saved user registers) and the
    /// type id of `struct pt_regs`: where the kernel has `bpf_rdonly_cast`, the registers are
    /// found from the stack without a helper call (both 0 where the BTF lacks either).
    pub task_stack: u32,
    pub pt_regs_type: u32,
}

impl ExitArgs {
    /// The offsets from `btf` for this build's architecture, or the first (struct, member) it
    /// lacks.
    pub fn from_btf(btf: &Btf<'_>) -> Result<Self, (&'static str, &'static str)> {
        let offset = |s: &'static str, m: &'static str| btf.member_offset(s, m).ok_or((s, m));
        let (task_stack, pt_regs_type) = btf
            .member_offset("task_struct", "stack")
            .zip(btf.struct_id("pt_regs"))
            .unwrap_or((0, 0));
        Ok(Self {
            task_pid: offset("task_struct", "pid")?,
            task_tgid: offset("task_struct", "tgid")?,
            regs: Self::arg_registers(&offset)?,
            task_stack,
            pt_regs_type,
        })
    }

    /// The syscall ABI's argument registers as `struct pt_regs` holds them (the project builds
    /// for x86_64 only; elsewhere reads keep their entry program).
    #[cfg(target_arch = "x86_64")]
    fn arg_registers(
        offset: &dyn Fn(&'static str, &'static str) -> Result<u32, (&'static str, &'static str)>,
    ) -> Result<[u32; 3], (&'static str, &'static str)> {
        Ok([
            offset("pt_regs", "di")?,
            offset("pt_regs", "si")?,
            offset("pt_regs", "dx")?,
        ])
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn arg_registers(
        _offset: &dyn Fn(&'static str, &'static str) -> Result<u32, (&'static str, &'static str)>,
    ) -> Result<[u32; 3], (&'static str, &'static str)> {
        Err(("pt_regs", "syscall arguments (known for x86_64 only)"))
    }
}

/// Where a TCP socket keeps what says when a write's bytes were transmitted (see the eBPF
/// crate's `socket/xmit.rs`): one window of `struct tcp_sock`, read at once, and the members'
/// offsets inside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XmitStamp {
    /// Offset of the window in `struct tcp_sock` (8-aligned).
    pub base: u32,
    pub write_seq: u32,
    pub snd_nxt: u32,
    pub wstamp_ns: u32,
    /// The type id of `struct tcp_sock`, for loads through a typed pointer where the kernel has
    /// `bpf_rdonly_cast` ([`KernelOffsets::rdonly_cast`]; 0: the window is read instead).
    pub tcp_sock_type: u32,
}

impl XmitStamp {
    /// The window the kernel program reads.
    pub const WINDOW: u32 = inferscope_common::XMIT_WINDOW as u32;

    /// The offsets from `btf`, or the first (struct, member) it lacks (or members that do not
    /// fit one window).
    pub fn from_btf(btf: &Btf<'_>) -> Result<Self, (&'static str, &'static str)> {
        let offset = |m: &'static str| btf.member_offset("tcp_sock", m).ok_or(("tcp_sock", m));
        let (write_seq, snd_nxt, wstamp_ns) = (
            offset("write_seq")?,
            offset("snd_nxt")?,
            offset("tcp_wstamp_ns")?,
        );
        let base = write_seq.min(snd_nxt).min(wstamp_ns) & !7;
        // In u64: the offsets are the BTF's, which a damaged blob can put anywhere.
        let end = (u64::from(write_seq) + 4)
            .max(u64::from(snd_nxt) + 4)
            .max(u64::from(wstamp_ns) + 8);
        let aligned =
            write_seq.is_multiple_of(4) && snd_nxt.is_multiple_of(4) && wstamp_ns.is_multiple_of(8);
        if end - u64::from(base) > u64::from(Self::WINDOW) || !aligned {
            return Err((
                "tcp_sock",
                "write_seq, snd_nxt and tcp_wstamp_ns (aligned, within one window)",
            ));
        }
        Ok(Self {
            base,
            write_seq: write_seq - base,
            snd_nxt: snd_nxt - base,
            wstamp_ns: wstamp_ns - base,
            // Found, as the members were; 0 would only mean the window is read instead.
            tcp_sock_type: btf.struct_id("tcp_sock").unwrap_or(0),
        })
    }
}

/// Every offset the kernel programs take from the running kernel's BTF, or why each is missing.
pub(crate) struct KernelOffsets {
    pub socket_walk: Result<SocketWalk, String>,
    pub exit_args: Result<ExitArgs, String>,
    pub xmit_stamp: Result<XmitStamp, String>,
    /// The BTF id of the kfunc `bpf_rdonly_cast` (6.2+), if the kernel has it.
    pub rdonly_cast: Option<u32>,
    /// How many parameters `inet_csk_accept` takes: its return value follows them in a fexit
    /// program's context (4 before 6.10: sk, flags, err, kern; 2 since: sk, arg).
    pub accept_params: Option<u32>,
}

/// Reads and parses `/sys/kernel/btf/vmlinux` (several MB) once for all of [`KernelOffsets`].
pub(crate) fn kernel_offsets() -> KernelOffsets {
    let missing =
        |(s, m): (&str, &str)| format!("the kernel's BTF has no member {m} in struct {s}");
    let parsed = std::fs::read(VMLINUX)
        .map_err(|e| format!("no kernel BTF ({VMLINUX}: {e})"))
        .and_then(|data| {
            let btf = Btf::parse(&data).map_err(|e| e.to_string())?;
            Ok(KernelOffsets {
                socket_walk: SocketWalk::from_btf(&btf).map_err(missing),
                exit_args: ExitArgs::from_btf(&btf).map_err(missing),
                xmit_stamp: XmitStamp::from_btf(&btf).map_err(missing),
                rdonly_cast: btf.func_id("bpf_rdonly_cast"),
                accept_params: btf.func_params("inet_csk_accept"),
            })
        });
    parsed.unwrap_or_else(|why| KernelOffsets {
        socket_walk: Err(why.clone()),
        exit_args: Err(why.clone()),
        xmit_stamp: Err(why),
        rdonly_cast: None,
        accept_params: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `types` are (name, info, size_or_type, extra words), `strings` the string
    /// section (offset 0 is the empty name).
    fn blob(types: &[(u32, u32, u32, Vec<u32>)], strings: &[u8]) -> Vec<u8> {
        let mut section = Vec::new();
        for (name, info, size, extra) in types {
            for w in [*name, *info, *size].iter().chain(extra) {
                section.extend_from_slice(&w.to_le_bytes());
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            HEADER_LEN as u32,
            0,
            section.len() as u32,
            section.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&section);
        out.extend_from_slice(strings);
        out
    }

    fn info(kind: u32, vlen: u32) -> u32 {
        (kind << 24) | vlen
    }

    #[test]
    fn finds_members_directly_and_through_anonymous_unions() {
        // "\0int\0outer\0a\0b\0c\0"
        let strings = b"\0int\0outer\0a\0b\0c\0";
        let (int, outer, a, b, c) = (1, 5, 11, 13, 15);
        let types = [
            // 1: int
            (int, info(KIND_INT, 0), 4, vec![32]),
            // 2: union { int b; int c; }
            (0, info(KIND_UNION, 2), 4, vec![b, 1, 0, c, 1, 0]),
            // 3: const union (a modifier in the way)
            (0, info(KIND_CONST, 0), 2, vec![]),
            // 4: struct outer { int a; <anonymous const union> at byte 8; }
            (outer, info(KIND_STRUCT, 2), 16, vec![a, 1, 0, 0, 3, 64]),
            // 5: a forward declaration of the same name comes first in real BTF sometimes
            (outer, 7 << 24, 0, vec![]),
        ];
        let data = blob(&types, strings);
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Some(0));
        assert_eq!(btf.member_offset("outer", "b"), Some(8));
        assert_eq!(btf.member_offset("outer", "c"), Some(8));
        assert_eq!(btf.member_offset("outer", "d"), None);
        assert_eq!(btf.member_offset("int", "a"), None);
    }

    #[test]
    fn bitfield_offsets_under_kind_flag() {
        let strings = b"\0s\0x\0y\0";
        let types = [
            (0, info(KIND_INT, 0), 4, vec![32]),
            // kind_flag: member offsets carry a bitfield size in the top byte.
            (
                1,
                info(KIND_STRUCT, 2) | 1 << 31,
                8,
                vec![3, 1, (3 << 24) | 5, 5, 1, 32],
            ),
        ];
        let data = blob(&types, strings);
        let btf = Btf::parse(&data).unwrap();
        // A bitfield not on a byte boundary has no byte offset.
        assert_eq!(btf.member_offset("s", "x"), None);
        assert_eq!(btf.member_offset("s", "y"), Some(4));
    }

    #[test]
    fn damaged_blobs_are_errors_not_panics() {
        let strings = b"\0s\0x\0";
        let types = [(1, info(KIND_STRUCT, 1), 4, vec![3, 0, 0])];
        let data = blob(&types, strings);
        for len in 0..data.len() {
            let _ = Btf::parse(&data[..len]).map(|btf| btf.member_offset("s", "x"));
        }
        let mut bad = data.clone();
        bad[0] = 0;
        assert!(matches!(Btf::parse(&bad), Err(BtfError::Magic(_))));
        let mut unknown = data.clone();
        unknown[HEADER_LEN + 7] = 30; // kind 30
        assert!(matches!(
            Btf::parse(&unknown),
            Err(BtfError::UnknownKind { kind: 30, id: 1 })
        ));
    }

    /// The running kernel's own BTF (every supported kernel has it: the agent needs 5.15+).
    #[test]
    fn the_running_kernels_socket_walk_offsets() {
        let walk = kernel_offsets().socket_walk.unwrap();
        // Stable since 2.6: fdtable opens with max_fds, then the fd array.
        assert_eq!(walk.fdt_max_fds, 0);
        assert_eq!(walk.fdt_fd, 8);
        // struct socket { state; type; flags; file; sk; ... } on 64-bit.
        assert_eq!(walk.socket_sk, 24);
        // sock_common: the address pair, the hash, the port pair, then the family.
        assert_eq!(walk.sock_family, 16);
        // This kernel has MPTCP (the connection_identity tests use it), so the walk looks at
        // the protocol: after sock_common, and in struct mptcp_sock after its struct sock.
        assert!(walk.sock_protocol > walk.sock_family);
        assert!(walk.mptcp_first > walk.sock_protocol);
        assert!(walk.task_files > 0 && walk.files_fdt > 0 && walk.file_private_data > 0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_running_kernels_exit_argument_offsets() {
        let args = kernel_offsets().exit_args.unwrap();
        // pid_t pid; pid_t tgid; side by side in every kernel since 2.6.
        assert_eq!(args.task_tgid, args.task_pid + 4);
        // The user register frame is ABI: x86_64's r15 .. di, 8 bytes each.
        assert_eq!(args.regs, [14 * 8, 13 * 8, 12 * 8]);
        assert!(args.task_stack > 0 && args.pt_regs_type > 0);
    }

    #[test]
    fn the_running_kernels_transmit_stamp_offsets() {
        let xmit = kernel_offsets().xmit_stamp.unwrap();
        // Inside the window, aligned for the kernel program's loads, and distinct.
        let fits = |offset: u32, size: u32| {
            offset.is_multiple_of(size) && offset + size <= XmitStamp::WINDOW
        };
        assert!(fits(xmit.write_seq, 4) && fits(xmit.snd_nxt, 4) && fits(xmit.wstamp_ns, 8));
        assert_eq!(xmit.base % 8, 0);
        assert_ne!(xmit.write_seq, xmit.snd_nxt);
        assert!(xmit.tcp_sock_type > 0);
    }

    #[test]
    fn type_ids_by_kind_and_name() {
        // 1: struct a (one member), 2: int, 3: func_proto, 4: func a, 5: fwd-declared b.
        let strings = b"\0a\0x\0int\0b\0";
        let data = blob(
            &[
                (1, info(KIND_STRUCT, 1), 4, vec![3, 2, 0]),
                (5, info(KIND_INT, 0), 4, vec![32]),
                (0, info(KIND_FUNC_PROTO, 0), 0, vec![]),
                (1, info(KIND_FUNC, 0), 3, vec![]),
                (9, info(KIND_STRUCT, 0), 0, vec![]),
            ],
            strings,
        );
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.struct_id("a"), Some(1));
        assert_eq!(btf.func_id("a"), Some(4));
        assert_eq!(btf.struct_id("b"), None, "a declaration is no definition");
        assert_eq!(btf.func_id("x"), None);
    }

    #[test]
    fn a_functions_parameters_are_counted_from_its_prototype() {
        // inet_csk_accept before 6.10: (sk, flags, err, kern); since: (sk, arg). 1: int,
        // 2: proto of four int parameters, 3: func a, 4: proto of two, 5: func b, 6: func c whose
        // "prototype" is an int (a damaged BTF).
        let strings = b"\0a\0b\0c\0int\0";
        let data = blob(
            &[
                (7, info(KIND_INT, 0), 4, vec![32]),
                (0, info(KIND_FUNC_PROTO, 4), 1, vec![0, 1, 0, 1, 0, 1, 0, 1]),
                (1, info(KIND_FUNC, 0), 2, vec![]),
                (0, info(KIND_FUNC_PROTO, 2), 1, vec![0, 1, 0, 1]),
                (3, info(KIND_FUNC, 0), 4, vec![]),
                (5, info(KIND_FUNC, 0), 1, vec![]),
            ],
            strings,
        );
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.func_params("a"), Some(4));
        assert_eq!(btf.func_params("b"), Some(2));
        assert_eq!(btf.func_params("c"), None);
        assert_eq!(btf.func_params("missing"), None);
    }

    #[test]
    fn the_running_kernel_has_bpf_rdonly_cast() {
        let offsets = kernel_offsets();
        // 6.2 added it; the project's test machines run 6.18.
        assert!(offsets.rdonly_cast.is_some_and(|id| id > 0));
    }

    #[test]
    fn the_running_kernels_accept_takes_two_parameters() {
        // inet_csk_accept(struct sock *sk, struct proto_accept_arg *arg) since 6.10; the kernel
        // matrix (scripts/kernels.sh) runs the four-parameter form of 5.10 to 6.6.
        assert_eq!(kernel_offsets().accept_params, Some(2));
    }
}
