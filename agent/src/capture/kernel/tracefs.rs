//! Tracepoint record layouts, from tracefs. Some records the kernel programs read changed
//! between releases (tcp:tcp_probe gained `sock_cookie`, `skbaddr` and `skaddr` over time), so the
//! programs take each field's offset from user space, which reads the tracepoint's `format`
//! file at load time. A field that is missing, or has another size than the program reads,
//! keeps its program unattached rather than misread.

/// Where tracefs lives: its own mount, or under debugfs on older setups.
const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FormatError {
    #[error(
        "cannot read the format of tracepoint {tracepoint} under {roots}: is tracefs mounted (mount -t tracefs nodev /sys/kernel/tracing)?",
        roots = ROOTS.join(" or ")
    )]
    Unreadable { tracepoint: String },
    #[error("tracepoint {tracepoint} has no field {field} on this kernel")]
    MissingField {
        tracepoint: String,
        field: &'static str,
    },
    #[error(
        "field {field} of tracepoint {tracepoint} has {found} bytes on this kernel, the program reads {expected}"
    )]
    FieldSize {
        tracepoint: String,
        field: &'static str,
        found: u32,
        expected: u32,
    },
}

/// One `field:` line of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    name: String,
    offset: u32,
    size: u32,
}

/// A tracepoint's record layout.
#[derive(Debug, Clone)]
pub(crate) struct Format {
    tracepoint: String,
    fields: Vec<Field>,
}

impl Format {
    /// Reads `events/{category}/{name}/format` from tracefs.
    pub(crate) fn read(category: &str, name: &str) -> Result<Self, FormatError> {
        let tracepoint = format!("{category}:{name}");
        ROOTS
            .iter()
            .find_map(|root| {
                std::fs::read_to_string(format!("{root}/events/{category}/{name}/format")).ok()
            })
            .map(|text| Self::parse(&tracepoint, &text))
            .ok_or(FormatError::Unreadable { tracepoint })
    }

    /// Parses a format file's text; lines that are not well-formed fields are skipped (they
    /// then show as missing fields).
    pub(crate) fn parse(tracepoint: &str, text: &str) -> Self {
        Self {
            tracepoint: tracepoint.to_owned(),
            fields: text.lines().filter_map(parse_field).collect(),
        }
    }

    /// The offset of field `name`, which the program reads as `size` bytes.
    pub(crate) fn offset(&self, name: &'static str, size: u32) -> Result<u32, FormatError> {
        let field = self.fields.iter().find(|f| f.name == name).ok_or_else(|| {
            FormatError::MissingField {
                tracepoint: self.tracepoint.clone(),
                field: name,
            }
        })?;
        if field.size != size {
            return Err(FormatError::FieldSize {
                tracepoint: self.tracepoint.clone(),
                field: name,
                found: field.size,
                expected: size,
            });
        }
        Ok(field.offset)
    }
}

/// `\tfield:__u8 daddr[28];\toffset:36;\tsize:28;\tsigned:0;`
fn parse_field(line: &str) -> Option<Field> {
    let rest = line.trim().strip_prefix("field:")?;
    let mut parts = rest.split(';').map(str::trim);
    let declaration = parts.next()?;
    // The name is the declaration's last word, without an array suffix.
    let name = declaration
        .rsplit([' ', '*'])
        .next()?
        .split('[')
        .next()?
        .to_owned();
    let mut offset = None;
    let mut size = None;
    for part in parts {
        if let Some(v) = part.strip_prefix("offset:") {
            offset = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.parse().ok();
        }
    }
    (!name.is_empty()).then_some(())?;
    Some(Field {
        name,
        offset: offset?,
        size: size?,
    })
}

/// tcp:tcp_probe's fields the `tcp_probe` program reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TcpProbeOffsets {
    /// The remote address, a `sockaddr_in6`-sized buffer.
    pub daddr: u32,
    pub sport: u32,
    pub dport: u32,
    pub family: u32,
    pub data_len: u32,
    /// The receiving socket (kernels from 6.x); 0 where absent: segments then join
    /// connections by address only.
    pub skaddr: u32,
}

impl TcpProbeOffsets {
    pub(crate) fn from_format(format: &Format) -> Result<Self, FormatError> {
        Ok(Self {
            daddr: format.offset("daddr", 28)?,
            sport: format.offset("sport", 2)?,
            dport: format.offset("dport", 2)?,
            family: format.offset("family", 2)?,
            data_len: format.offset("data_len", 2)?,
            skaddr: format.offset("skaddr", 8).unwrap_or(0),
        })
    }

    /// The integer fields sit where the program can load them in place (see
    /// [`inferscope_common::tcp_probe_layout`]).
    pub(crate) fn in_place(&self) -> bool {
        use inferscope_common::tcp_probe_layout as l;
        (
            self.daddr,
            self.sport,
            self.dport,
            self.family,
            self.data_len,
        ) == (l::DADDR, l::SPORT, l::DPORT, l::FAMILY, l::DATA_LEN)
    }
}

/// sock:inet_sock_set_state's skaddr, oldstate, newstate, sport and protocol offsets (the
/// `sock_state` program reads them at these offsets), all or none. Kernels before 4.16 lack
/// `protocol`.
pub(crate) fn sock_state_offsets(format: &Format) -> Result<[u32; 5], FormatError> {
    Ok([
        format.offset("skaddr", 8)?,
        format.offset("oldstate", 4)?,
        format.offset("newstate", 4)?,
        format.offset("sport", 2)?,
        format.offset("protocol", 2)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's (Linux 6.18) format files, copied from tracefs.
    const TCP_PROBE: &str = include_str!("../../../../tests/fixtures/tracefs/tcp_probe.format");
    const SOCK_STATE: &str =
        include_str!("../../../../tests/fixtures/tracefs/inet_sock_set_state.format");

    #[test]
    fn reads_tcp_probe_offsets_from_a_real_format_file() {
        let format = Format::parse("tcp:tcp_probe", TCP_PROBE);
        assert_eq!(
            TcpProbeOffsets::from_format(&format),
            Ok(TcpProbeOffsets {
                daddr: 36,
                sport: 64,
                dport: 66,
                family: 68,
                data_len: 76,
                skaddr: 128,
            })
        );
        assert!(TcpProbeOffsets::from_format(&format).is_ok_and(|o| o.in_place()));
    }

    #[test]
    fn a_moved_field_is_read_through_its_offset_not_in_place() {
        // Kernels before `family` and `mark` (5.x): data_len right after the ports.
        let older = TCP_PROBE
            .replace("data_len;\toffset:76;", "data_len;\toffset:68;")
            .replace(" family;", " fam;");
        let moved = TCP_PROBE.replace("data_len;\toffset:76;", "data_len;\toffset:80;");
        let offsets = TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &moved));
        assert_eq!(offsets.map(|o| (o.data_len, o.in_place())), Ok((80, false)));
        assert!(TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &older)).is_err());
    }

    #[test]
    fn tcp_probe_without_skaddr_still_attaches() {
        let old: String = TCP_PROBE
            .lines()
            .filter(|l| !l.contains(" skaddr;"))
            .collect::<Vec<_>>()
            .join("\n");
        let offsets = TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &old));
        assert_eq!(offsets.map(|o| (o.data_len, o.skaddr)), Ok((76, 0)));
    }

    #[test]
    fn a_missing_or_resized_tcp_probe_field_is_an_error_not_a_misread() {
        let renamed = TCP_PROBE.replace(" data_len;", " len;");
        assert_eq!(
            TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &renamed)),
            Err(FormatError::MissingField {
                tracepoint: "tcp:tcp_probe".into(),
                field: "data_len",
            })
        );
        let widened = TCP_PROBE.replace(
            "data_len;\toffset:76;\tsize:2;",
            "data_len;\toffset:76;\tsize:4;",
        );
        assert!(matches!(
            TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &widened)),
            Err(FormatError::FieldSize {
                field: "data_len",
                found: 4,
                expected: 2,
                ..
            })
        ));
        // The IPv4-only layout of kernels before 4.16 (daddr as a 4-byte array).
        let v4 = TCP_PROBE.replace(
            "daddr[28];\toffset:36;\tsize:28;",
            "daddr[4];\toffset:36;\tsize:4;",
        );
        assert!(TcpProbeOffsets::from_format(&Format::parse("tcp:tcp_probe", &v4)).is_err());
    }

    #[test]
    fn reads_the_state_change_layout_from_a_real_format_file() {
        let format = Format::parse("sock:inet_sock_set_state", SOCK_STATE);
        assert_eq!(sock_state_offsets(&format), Ok([8, 16, 20, 24, 30]));
        // Kernels before 4.16's protocol field: not attached rather than misread.
        let old = SOCK_STATE.replace(" protocol;", " proto;");
        assert!(sock_state_offsets(&Format::parse("sock:inet_sock_set_state", &old)).is_err());
    }

    #[test]
    fn parses_field_lines_and_skips_the_rest() {
        assert_eq!(
            parse_field("\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;"),
            Some(Field {
                name: "skaddr".into(),
                offset: 128,
                size: 8
            })
        );
        assert_eq!(
            parse_field("\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;")
                .map(|f| f.name),
            Some("saddr_v6".into())
        );
        assert_eq!(parse_field("print fmt: \"family=%s\""), None);
        assert_eq!(parse_field("\tfield:int x;\toffset:;\tsize:4;"), None);
        assert_eq!(parse_field(""), None);
    }
}
