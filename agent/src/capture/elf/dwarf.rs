//! Byte offsets of struct members, read from an ELF object's DWARF. Uprobe programs read fields
//! such as `server_task::id` out of the arguments they see; with debug info the offsets come from
//! the engine's own build instead of being assumed. Builds without DWARF (most standalone engine
//! binaries) are a normal outcome: every offset is then `None`.
//!
//! Engine libraries carry tens of MB of DWARF (xllamacpp: 30 MB .debug_info, 13 MB .debug_str),
//! so only .debug_abbrev is read whole. Each unit's header and root entry are parsed from a short
//! prefix to decide whether the unit is walked; only walked units are read in full, one at a time;
//! strings are read one by one from .debug_str, .debug_line_str and .debug_str_offsets.
//! Compressed debug sections are refused with an error rather than inflated whole. Not read:
//! DWARF 4 type units in .debug_types (`-fdebug-types-section`), split DWARF (.dwo) and separate
//! debug files found through .gnu_debuglink (pass such a file's own path instead).
use std::{fs::File, io, os::unix::fs::FileExt, path::Path};

use gimli::{
    AttributeValue, DebugAbbrev, DebugInfo, EndianSlice, EntriesTreeNode, Reader, RunTimeEndian,
    UnitHeader, constants,
};
use object::{CompressionFormat, Object, ObjectKind, ObjectSection, read::ReadCache};

/// Enough for a unit header and the root entry of every producer seen; a longer root entry
/// makes the unit be read in full.
const PREFIX_LEN: usize = 512;
/// Nested namespaces and types deeper than this are not searched, so a malformed file cannot
/// exhaust the stack.
const MAX_SCOPE_DEPTH: usize = 64;
/// Unit names (source paths) longer than this never match a hint.
const MAX_UNIT_NAME: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DwarfError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not an ELF file this agent can read: {source}")]
    Parse {
        path: String,
        #[source]
        source: object::Error,
    },
    #[error(
        "{path} is a relocatable object (.o) whose DWARF is not relocated yet; \
         point at the linked executable or shared library"
    )]
    Relocatable { path: String },
    #[error(
        "{path}: section {section} is compressed ({format}); compressed debug info is not \
         supported (a copy made with `objcopy --decompress-debug-sections` can be read)"
    )]
    Compressed {
        path: String,
        section: &'static str,
        format: String,
    },
    #[error(
        "{path}: section {section} (file offset {offset:#x}, {size} bytes) lies outside the \
         {file_len}-byte file; the file is truncated or corrupt"
    )]
    SectionBounds {
        path: String,
        section: &'static str,
        offset: u64,
        size: u64,
        file_len: u64,
    },
    #[error(
        "{path}: malformed DWARF: {len} bytes at {section}+{offset:#x} lie past the end of \
         the section"
    )]
    OutOfSection {
        path: String,
        section: &'static str,
        offset: u64,
        len: u64,
    },
    #[error("{path}: cannot read {len} bytes of {section} at offset {offset:#x}: {source}")]
    Read {
        path: String,
        section: &'static str,
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("{path}: malformed DWARF in the unit at .debug_info+{unit:#x}: {source}")]
    Dwarf {
        path: String,
        unit: u64,
        #[source]
        source: gimli::Error,
    },
}

/// Byte offsets of named members of named structs (or classes), read from the DWARF of the ELF
/// file at `path`: one answer per `(struct, member)` pair of `wanted`, in order.
///
/// A struct is a complete definition (has DW_AT_byte_size, is not a declaration) whose DW_AT_name
/// equals the struct name, at any namespace or nesting level; the first one found is used. Only
/// its direct members are searched. `None` means not found, a bit-field, or a location that is not
/// a constant (logged). With `unit_hint`, only compilation units whose DW_AT_name contains the hint
/// are walked (type units, having no name, then never are). A file without DWARF, or with its
/// DWARF split off into a separate file, gives all `None`.
pub(crate) fn member_offsets(
    path: &Path,
    wanted: &[(&str, &str)],
    unit_hint: Option<&str>,
) -> Result<Vec<Option<u64>>, DwarfError> {
    member_offsets_reading(path, wanted, unit_hint, PREFIX_LEN)
}

/// [`member_offsets`], deciding on each unit from its first `prefix_len` bytes.
fn member_offsets_reading(
    path: &Path,
    wanted: &[(&str, &str)],
    unit_hint: Option<&str>,
    prefix_len: usize,
) -> Result<Vec<Option<u64>>, DwarfError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let shown = path.display().to_string();
    let file = File::open(path).map_err(|source| DwarfError::Open {
        path: shown.clone(),
        source,
    })?;
    let Some(sections) = locate_sections(&file, &shown)? else {
        tracing::debug!(path = %shown, "no DWARF: struct member offsets unknown");
        return Ok(vec![None; wanted.len()]);
    };
    let abbrev_bytes = sections.read(&sections.abbrev, 0, sections.abbrev.size)?;
    let mut search = Search::new(&sections, wanted, prefix_len);
    search.run(&abbrev_bytes, unit_hint)?;
    tracing::debug!(
        path = %shown,
        units = search.stats.units,
        walked = search.stats.units_walked,
        bytes_walked = search.stats.bytes_walked,
        non_constant_locations = search.stats.non_constant_locations,
        bit_fields = search.stats.bit_fields,
        too_deep = search.stats.too_deep,
        "struct member offsets read from DWARF"
    );
    Ok(search.found)
}

/// A debug section's place in the file.
#[derive(Debug, Clone, Copy)]
struct Section {
    name: &'static str,
    offset: u64,
    size: u64,
}

struct Sections<'f> {
    file: &'f File,
    path: &'f str,
    endian: RunTimeEndian,
    info: Section,
    abbrev: Section,
    str: Option<Section>,
    str_offsets: Option<Section>,
    line_str: Option<Section>,
}

/// The debug sections this search reads, or `None` when the file has no DWARF of its own.
fn locate_sections<'f>(file: &'f File, path: &'f str) -> Result<Option<Sections<'f>>, DwarfError> {
    let file_len = file
        .metadata()
        .map_err(|source| DwarfError::Open {
            path: path.to_owned(),
            source,
        })?
        .len();
    let cache = ReadCache::new(file);
    let obj = object::File::parse(&cache).map_err(|source| DwarfError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let find = |name: &'static str| -> Result<Option<Section>, DwarfError> {
        let Some(section) = obj.section_by_name(name) else {
            // GNU-style compressed sections are found under their own name only when object's
            // decompression is built in, which it is not here.
            let gnu = name.replacen(".debug_", ".zdebug_", 1);
            if obj.section_by_name(&gnu).is_some() {
                return Err(DwarfError::Compressed {
                    path: path.to_owned(),
                    section: name,
                    format: format!("zlib, as {gnu}"),
                });
            }
            return Ok(None);
        };
        let range = section
            .compressed_file_range()
            .map_err(|source| DwarfError::Parse {
                path: path.to_owned(),
                source,
            })?;
        if range.format != CompressionFormat::None {
            return Err(DwarfError::Compressed {
                path: path.to_owned(),
                section: name,
                format: format!("{:?}", range.format),
            });
        }
        // No bytes in the file (SHT_NOBITS): nothing to read.
        let Some((offset, size)) = section.file_range() else {
            return Ok(None);
        };
        if size == 0 {
            return Ok(None);
        }
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return Err(DwarfError::SectionBounds {
                path: path.to_owned(),
                section: name,
                offset,
                size,
                file_len,
            });
        }
        Ok(Some(Section { name, offset, size }))
    };
    let Some(info) = find(".debug_info")? else {
        return Ok(None);
    };
    if obj.kind() == ObjectKind::Relocatable {
        return Err(DwarfError::Relocatable {
            path: path.to_owned(),
        });
    }
    // Units without abbreviations cannot be parsed: treat like no DWARF.
    let Some(abbrev) = find(".debug_abbrev")? else {
        return Ok(None);
    };
    let endian = if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    Ok(Some(Sections {
        file,
        path,
        endian,
        info,
        abbrev,
        str: find(".debug_str")?,
        str_offsets: find(".debug_str_offsets")?,
        line_str: find(".debug_line_str")?,
    }))
}

impl Sections<'_> {
    fn out_of_section(&self, section: &'static str, offset: u64, len: u64) -> DwarfError {
        DwarfError::OutOfSection {
            path: self.path.to_owned(),
            section,
            offset,
            len,
        }
    }

    /// Reads `len` bytes at `offset` within `section` into `buf`, replacing its contents.
    fn read_into(
        &self,
        section: &Section,
        offset: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<(), DwarfError> {
        if offset.checked_add(len).is_none_or(|end| end > section.size) {
            return Err(self.out_of_section(section.name, offset, len));
        }
        // Within the section, which was checked to lie within the file.
        let size =
            usize::try_from(len).map_err(|_| self.out_of_section(section.name, offset, len))?;
        buf.clear();
        buf.resize(size, 0);
        self.file
            .read_exact_at(buf, section.offset + offset)
            .map_err(|source| DwarfError::Read {
                path: self.path.to_owned(),
                section: section.name,
                offset,
                len,
                source,
            })
    }

    fn read(&self, section: &Section, offset: u64, len: u64) -> Result<Vec<u8>, DwarfError> {
        let mut buf = Vec::new();
        self.read_into(section, offset, len, &mut buf)?;
        Ok(buf)
    }

    /// The NUL-terminated string at `offset`, or `None` when it is longer than `max` bytes
    /// (callers only compare against names of known length).
    fn string_at(
        &self,
        section: Option<&Section>,
        name: &'static str,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<u8>>, DwarfError> {
        let Some(section) = section else {
            return Err(self.out_of_section(name, offset, 1));
        };
        let mut out = Vec::new();
        let mut chunk = Vec::new();
        let mut at = offset;
        loop {
            let left = section.size.saturating_sub(at);
            if left == 0 {
                return Err(self.out_of_section(name, offset, at - offset + 1));
            }
            // One byte past `max` tells a longer string from one of exactly `max` bytes.
            let want = (max + 1 - out.len()).min(64) as u64;
            self.read_into(section, at, want.min(left), &mut chunk)?;
            if let Some(nul) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return Ok((out.len() <= max).then_some(out));
            }
            out.extend_from_slice(&chunk);
            if out.len() > max {
                return Ok(None);
            }
            at += chunk.len() as u64;
        }
    }
}

type Slice<'a> = EndianSlice<'a, RunTimeEndian>;

/// One struct name of the request, with the members asked of it.
struct WantedStruct<'w> {
    name: &'w str,
    /// (member name, index into the answers).
    members: Vec<(&'w str, usize)>,
    /// A definition was found (in an earlier unit, or earlier in this one).
    seen: bool,
}

#[derive(Debug, Default)]
struct Stats {
    units: u64,
    units_walked: u64,
    bytes_walked: u64,
    non_constant_locations: u64,
    bit_fields: u64,
    too_deep: u64,
}

struct Search<'s, 'w> {
    sections: &'s Sections<'s>,
    structs: Vec<WantedStruct<'w>>,
    prefix_len: u64,
    found: Vec<Option<u64>>,
    longest_struct: usize,
    longest_member: usize,
    stats: Stats,
    /// The unit being read, for error messages, and its string offsets base (DWARF 5).
    unit: u64,
    str_offsets_base: u64,
    format: gimli::Format,
}

enum Location {
    Offset(u64),
    BitField,
    NotConstant,
}

impl<'s, 'w> Search<'s, 'w> {
    fn new(sections: &'s Sections<'s>, wanted: &[(&'w str, &'w str)], prefix_len: usize) -> Self {
        let mut structs: Vec<WantedStruct<'w>> = Vec::new();
        for (i, (name, member)) in wanted.iter().enumerate() {
            match structs.iter_mut().find(|s| s.name == *name) {
                Some(s) => s.members.push((member, i)),
                None => structs.push(WantedStruct {
                    name,
                    members: vec![(member, i)],
                    seen: false,
                }),
            }
        }
        Self {
            sections,
            // The longest initial length field, so that the unit's length can always be read.
            prefix_len: prefix_len.max(12) as u64,
            longest_struct: structs.iter().map(|s| s.name.len()).max().unwrap_or(0),
            longest_member: wanted.iter().map(|(_, m)| m.len()).max().unwrap_or(0),
            structs,
            found: vec![None; wanted.len()],
            stats: Stats::default(),
            unit: 0,
            str_offsets_base: 0,
            format: gimli::Format::Dwarf32,
        }
    }

    fn done(&self) -> bool {
        self.structs.iter().all(|s| s.seen)
    }

    fn dwarf_error(&self, source: gimli::Error) -> DwarfError {
        DwarfError::Dwarf {
            path: self.sections.path.to_owned(),
            unit: self.unit,
            source,
        }
    }

    fn run(&mut self, abbrev_bytes: &[u8], unit_hint: Option<&str>) -> Result<(), DwarfError> {
        let sections = self.sections;
        let endian = sections.endian;
        let debug_abbrev = DebugAbbrev::new(abbrev_bytes, endian);
        let info = sections.info;
        let mut buf = Vec::new();
        let mut offset = 0u64;
        while offset < info.size && !self.done() {
            self.unit = offset;
            self.stats.units += 1;
            let prefix_len = self.prefix_len.min(info.size - offset);
            sections.read_into(&info, offset, prefix_len, &mut buf)?;
            let (unit_length, format) = Slice::new(&buf, endian)
                .read_initial_length()
                .map_err(|e| self.dwarf_error(e))?;
            let length_size = u64::from(format.initial_length_size());
            let unit_length = unit_length as u64;
            let total = unit_length
                .checked_add(length_size)
                .filter(|total| {
                    offset
                        .checked_add(*total)
                        .is_some_and(|end| end <= info.size)
                })
                .ok_or_else(|| sections.out_of_section(info.name, offset, unit_length))?;
            let complete = total <= prefix_len;
            if complete {
                buf.truncate(total as usize);
            } else {
                // Shorten the unit's length so gimli parses the header and root entry from
                // the prefix alone; the rest of the unit is read only if it is walked.
                let shorter = prefix_len - length_size;
                match (format, endian) {
                    (gimli::Format::Dwarf32, RunTimeEndian::Little) => {
                        buf[..4].copy_from_slice(&(shorter as u32).to_le_bytes())
                    }
                    (gimli::Format::Dwarf32, RunTimeEndian::Big) => {
                        buf[..4].copy_from_slice(&(shorter as u32).to_be_bytes())
                    }
                    (gimli::Format::Dwarf64, RunTimeEndian::Little) => {
                        buf[4..12].copy_from_slice(&shorter.to_le_bytes())
                    }
                    (gimli::Format::Dwarf64, RunTimeEndian::Big) => {
                        buf[4..12].copy_from_slice(&shorter.to_be_bytes())
                    }
                }
            }
            let walk = match self.select_unit(&buf, &debug_abbrev, unit_hint) {
                Ok(walk) => walk,
                // The root entry runs past the prefix: decide on the whole unit.
                Err(_) if !complete => {
                    sections.read_into(&info, offset, total, &mut buf)?;
                    self.select_unit(&buf, &debug_abbrev, unit_hint)
                        .map_err(|e| self.dwarf_error(e))?
                }
                Err(e) => return Err(self.dwarf_error(e)),
            };
            if walk {
                if buf.len() as u64 != total {
                    sections.read_into(&info, offset, total, &mut buf)?;
                }
                self.stats.units_walked += 1;
                self.stats.bytes_walked += total;
                self.walk_unit(&buf, &debug_abbrev)?;
            }
            offset += total;
        }
        Ok(())
    }

    /// The first unit header in `bytes`.
    fn header<'b>(&self, bytes: &'b [u8]) -> Result<UnitHeader<Slice<'b>>, gimli::Error> {
        DebugInfo::new(bytes, self.sections.endian)
            .units()
            .next()?
            .ok_or(gimli::Error::UnexpectedEof(gimli::ReaderOffsetId(0)))
    }

    /// Whether the unit starting `bytes` is to be walked: every unit without a hint, else the
    /// compilation units whose name contains the hint.
    fn select_unit(
        &mut self,
        bytes: &[u8],
        debug_abbrev: &DebugAbbrev<Slice<'_>>,
        unit_hint: Option<&str>,
    ) -> Result<bool, gimli::Error> {
        let Some(hint) = unit_hint else {
            return Ok(true);
        };
        let header = self.header(bytes)?;
        let abbrevs = header.abbreviations(debug_abbrev)?;
        let mut tree = header.entries_tree(&abbrevs, None)?;
        let root = tree.root()?;
        let entry = root.entry();
        self.format = header.format();
        self.str_offsets_base = match entry.attr_value(constants::DW_AT_str_offsets_base) {
            Some(AttributeValue::DebugStrOffsetsBase(base)) => base.0 as u64,
            _ => 0,
        };
        let Some(name) = entry.attr_value(constants::DW_AT_name) else {
            return Ok(false);
        };
        // Strings of the unit name are read from other sections; their errors decide nothing
        // about this unit's bytes, so a name that cannot be read just does not match.
        match self.string(name, MAX_UNIT_NAME) {
            Ok(Some(name)) => Ok(contains(&name, hint.as_bytes())),
            Ok(None) => Ok(false),
            Err(e) => {
                tracing::debug!(unit = self.unit, error = %e, "unreadable unit name");
                Ok(false)
            }
        }
    }

    fn walk_unit(
        &mut self,
        bytes: &[u8],
        debug_abbrev: &DebugAbbrev<Slice<'_>>,
    ) -> Result<(), DwarfError> {
        let header = self.header(bytes).map_err(|e| self.dwarf_error(e))?;
        let abbrevs = header
            .abbreviations(debug_abbrev)
            .map_err(|e| self.dwarf_error(e))?;
        let mut tree = header
            .entries_tree(&abbrevs, None)
            .map_err(|e| self.dwarf_error(e))?;
        let root = tree.root().map_err(|e| self.dwarf_error(e))?;
        self.format = header.format();
        self.str_offsets_base = match root.entry().attr_value(constants::DW_AT_str_offsets_base) {
            Some(AttributeValue::DebugStrOffsetsBase(base)) => base.0 as u64,
            _ => 0,
        };
        self.scope(root, 0, None)
    }

    /// Searches the children of a namespace, type or unit entry; `owner` is the wanted struct
    /// whose definition this entry is.
    fn scope(
        &mut self,
        node: EntriesTreeNode<'_, '_, Slice<'_>>,
        depth: usize,
        owner: Option<usize>,
    ) -> Result<(), DwarfError> {
        let mut children = node.children();
        while let Some(child) = children.next().map_err(|e| self.dwarf_error(e))? {
            let entry = child.entry();
            match entry.tag() {
                constants::DW_TAG_member => {
                    if let Some(owner) = owner {
                        self.member(owner, entry)?;
                    }
                }
                tag @ (constants::DW_TAG_namespace
                | constants::DW_TAG_structure_type
                | constants::DW_TAG_class_type
                | constants::DW_TAG_union_type) => {
                    if depth >= MAX_SCOPE_DEPTH {
                        self.stats.too_deep += 1;
                        continue;
                    }
                    let defines = if tag == constants::DW_TAG_namespace
                        || tag == constants::DW_TAG_union_type
                    {
                        None
                    } else {
                        self.wanted_definition(entry)?
                    };
                    self.scope(child, depth + 1, defines)?;
                    if let Some(i) = defines {
                        self.structs[i].seen = true;
                    }
                    if self.done() {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The wanted struct that `entry` is a complete definition of, if any.
    fn wanted_definition(
        &self,
        entry: &gimli::DebuggingInformationEntry<Slice<'_>>,
    ) -> Result<Option<usize>, DwarfError> {
        let declaration = matches!(
            entry.attr_value(constants::DW_AT_declaration),
            Some(AttributeValue::Flag(true))
        );
        if declaration || !entry.has_attr(constants::DW_AT_byte_size) {
            return Ok(None);
        }
        let Some(name) = entry.attr_value(constants::DW_AT_name) else {
            return Ok(None);
        };
        let Some(name) = self.string(name, self.longest_struct)? else {
            return Ok(None);
        };
        Ok(self
            .structs
            .iter()
            .position(|s| !s.seen && s.name.as_bytes() == name.as_slice()))
    }

    fn member(
        &mut self,
        owner: usize,
        entry: &gimli::DebuggingInformationEntry<Slice<'_>>,
    ) -> Result<(), DwarfError> {
        let Some(name) = entry.attr_value(constants::DW_AT_name) else {
            return Ok(());
        };
        let Some(name) = self.string(name, self.longest_member)? else {
            return Ok(());
        };
        let Some(&(member, index)) = self.structs[owner]
            .members
            .iter()
            .find(|(member, _)| member.as_bytes() == name.as_slice())
        else {
            return Ok(());
        };
        match location(entry) {
            Location::Offset(offset) => self.found[index] = Some(offset),
            Location::BitField => {
                self.stats.bit_fields += 1;
                tracing::warn!(
                    path = self.sections.path,
                    "{}::{member} is a bit-field: no byte offset to read it at",
                    self.structs[owner].name
                );
            }
            Location::NotConstant => {
                self.stats.non_constant_locations += 1;
                tracing::warn!(
                    path = self.sections.path,
                    "{}::{member} has a computed location (virtual base?), not a constant offset",
                    self.structs[owner].name
                );
            }
        }
        Ok(())
    }

    /// The bytes of a string attribute, or `None` when longer than `max`.
    fn string(
        &self,
        value: AttributeValue<Slice<'_>>,
        max: usize,
    ) -> Result<Option<Vec<u8>>, DwarfError> {
        let s = self.sections;
        match value {
            AttributeValue::String(bytes) => {
                let bytes = bytes.slice();
                Ok((bytes.len() <= max).then(|| bytes.to_vec()))
            }
            AttributeValue::DebugStrRef(offset) => {
                s.string_at(s.str.as_ref(), ".debug_str", offset.0 as u64, max)
            }
            AttributeValue::DebugLineStrRef(offset) => {
                s.string_at(s.line_str.as_ref(), ".debug_line_str", offset.0 as u64, max)
            }
            AttributeValue::DebugStrOffsetsIndex(index) => {
                let word = u64::from(self.format.word_size());
                let at = (index.0 as u64)
                    .checked_mul(word)
                    .and_then(|o| o.checked_add(self.str_offsets_base))
                    .ok_or_else(|| s.out_of_section(".debug_str_offsets", u64::MAX, word))?;
                let Some(table) = s.str_offsets.as_ref() else {
                    return Err(s.out_of_section(".debug_str_offsets", at, word));
                };
                let bytes = s.read(table, at, word)?;
                let offset = Slice::new(&bytes, s.endian)
                    .read_offset(self.format)
                    .map_err(|e| self.dwarf_error(e))?;
                s.string_at(s.str.as_ref(), ".debug_str", offset as u64, max)
            }
            // Strings in a supplementary file (dwz) are not followed.
            _ => Ok(None),
        }
    }
}

/// Where a member lies within its struct.
fn location(entry: &gimli::DebuggingInformationEntry<Slice<'_>>) -> Location {
    if entry.has_attr(constants::DW_AT_bit_size) {
        return Location::BitField;
    }
    match entry.attr_value(constants::DW_AT_data_member_location) {
        Some(AttributeValue::Udata(offset)) => Location::Offset(offset),
        Some(AttributeValue::Sdata(offset)) => {
            u64::try_from(offset).map_or(Location::NotConstant, Location::Offset)
        }
        // DWARF 2 and 3 producers write constant offsets as `DW_OP_plus_uconst N`.
        Some(AttributeValue::Exprloc(expr)) => {
            let mut ops = expr.0;
            match ops.read_u8() {
                Ok(op) if op == constants::DW_OP_plus_uconst.0 => match ops.read_uleb128() {
                    Ok(offset) if ops.is_empty() => Location::Offset(offset),
                    _ => Location::NotConstant,
                },
                _ => Location::NotConstant,
            }
        }
        Some(_) => Location::NotConstant,
        // DWARF: a member starting where its struct starts needs no location.
        None => Location::Offset(0),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use std::{
        path::PathBuf,
        process::{Command, Stdio},
    };

    use super::*;

    const FIXTURE: &str = r#"
        struct task { int id; int id_slot; char name[13]; double weight; };
        struct slot { char pad[24]; long id; unsigned flag : 3; };
        struct declared_only;
        int use(struct task *t, struct slot *s, struct declared_only *d) {
            return t->id + (int)s->id + (int)s->flag + (d != 0);
        }
    "#;

    const WANTED: &[(&str, &str)] = &[
        ("task", "id"),
        ("task", "id_slot"),
        ("task", "weight"),
        ("slot", "id"),
        ("slot", "flag"),
        ("slot", "missing"),
        ("declared_only", "x"),
        ("absent", "id"),
    ];
    /// Answers for WANTED: `flag` is a bit-field, the rest are not defined.
    const EXPECTED: &[Option<u64>] =
        &[Some(0), Some(4), Some(24), Some(24), None, None, None, None];

    /// Compiles `sources` ((file name, text)) with `compiler` and `flags` into `out` in `dir`.
    fn compile(
        dir: &Path,
        compiler: &str,
        sources: &[(&str, &str)],
        flags: &[&str],
        out: &str,
    ) -> PathBuf {
        let mut cmd = Command::new(compiler);
        cmd.current_dir(dir).args(flags).arg("-o").arg(out);
        for (name, text) in sources {
            std::fs::write(dir.join(name), text).unwrap();
            cmd.arg(name);
        }
        let output = cmd
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("running {compiler} (scripts/setup.sh installs it): {e}"));
        assert!(
            output.status.success(),
            "{compiler} {flags:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        dir.join(out)
    }

    fn library(dir: &Path, compiler: &str, debug: &str) -> PathBuf {
        let out = format!("lib{compiler}{debug}.so");
        compile(
            dir,
            compiler,
            &[("fixture.c", FIXTURE)],
            &["-shared", "-fPIC", "-O1", debug],
            &out,
        )
    }

    #[test]
    fn dwarf_offsets_from_gcc_in_every_dwarf_version() {
        let dir = tempfile::tempdir().unwrap();
        // DWARF 2 and 3 write offsets as expressions, 4 as constants, 5 adds .debug_line_str.
        for debug in ["-gdwarf-2", "-gdwarf-3", "-gdwarf-4", "-gdwarf-5"] {
            let lib = library(dir.path(), "gcc", debug);
            let found = member_offsets(&lib, WANTED, None).unwrap();
            assert_eq!(found, EXPECTED, "gcc {debug}");
        }
    }

    #[test]
    fn dwarf_offsets_from_clang_indexed_strings() {
        // clang's DWARF 5 names everything through .debug_str_offsets (DW_FORM_strx).
        let dir = tempfile::tempdir().unwrap();
        let lib = library(dir.path(), "clang", "-gdwarf-5");
        assert_eq!(member_offsets(&lib, WANTED, None).unwrap(), EXPECTED);
        assert_eq!(
            member_offsets(&lib, &[("task", "name")], Some("fixture")).unwrap(),
            vec![Some(8)]
        );
    }

    #[test]
    fn dwarf_unit_hint_selects_units_by_name() {
        // The same struct name with different layouts in two units: the hint decides which.
        let dir = tempfile::tempdir().unwrap();
        let lib = compile(
            dir.path(),
            "gcc",
            &[
                (
                    "unit-one.c",
                    "struct conf { int a; int b; };\nint one(struct conf *c) { return c->b; }\n",
                ),
                (
                    "unit-two.c",
                    "struct conf { long pad[3]; int b; };\nint two(struct conf *c) { return c->b; }\n",
                ),
            ],
            &["-shared", "-fPIC", "-g"],
            "libunits.so",
        );
        let wanted = [("conf", "b")];
        assert_eq!(
            member_offsets(&lib, &wanted, Some("unit-one")).unwrap(),
            [Some(4)]
        );
        assert_eq!(
            member_offsets(&lib, &wanted, Some("unit-two")).unwrap(),
            [Some(24)]
        );
        assert_eq!(
            member_offsets(&lib, &wanted, Some("unit-three")).unwrap(),
            [None]
        );
        // Without a hint the first unit's definition wins.
        assert_eq!(member_offsets(&lib, &wanted, None).unwrap(), [Some(4)]);
    }

    #[test]
    fn dwarf_cpp_namespaces_classes_and_nested_types() {
        let dir = tempfile::tempdir().unwrap();
        let source = r#"
            namespace engine {
                class server_task { public: int id; int index; long id_slot; };
                struct server_slot { struct params { int a; char b; } p; int id; };
            }
            int use(engine::server_task &t, engine::server_slot &s, engine::server_slot::params &p) {
                return t.id + s.id + p.b;
            }
        "#;
        for compiler in ["g++", "clang++"] {
            let lib = compile(
                dir.path(),
                compiler,
                &[("server-task.cpp", source)],
                &["-shared", "-fPIC", "-g"],
                &format!("lib{compiler}.so"),
            );
            let found = member_offsets(
                &lib,
                &[
                    ("server_task", "id"),
                    ("server_task", "id_slot"),
                    ("server_slot", "id"),
                    ("params", "b"),
                ],
                Some("server-"),
            )
            .unwrap();
            assert_eq!(found, [Some(0), Some(8), Some(8), Some(4)], "{compiler}");
        }
    }

    #[test]
    fn dwarf_root_entry_past_the_prefix_is_read_whole() {
        // A prefix too short for any root entry takes the read-the-whole-unit path.
        let dir = tempfile::tempdir().unwrap();
        let lib = library(dir.path(), "gcc", "-gdwarf-4");
        for prefix in [0, 13, 20, 64] {
            assert_eq!(
                member_offsets_reading(&lib, WANTED, Some("fixture"), prefix).unwrap(),
                EXPECTED,
                "prefix {prefix}"
            );
        }
    }

    #[test]
    fn dwarf_absent_gives_nones() {
        let dir = tempfile::tempdir().unwrap();
        let lib = library(dir.path(), "gcc", "-g0");
        assert_eq!(
            member_offsets(&lib, WANTED, None).unwrap(),
            vec![None; WANTED.len()]
        );
        // Stripped of its debug sections after linking: the same.
        let stripped = dir.path().join("libstripped.so");
        let status = Command::new("objcopy")
            .arg("--strip-debug")
            .arg(library(dir.path(), "gcc", "-g"))
            .arg(&stripped)
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(
            member_offsets(&stripped, WANTED, Some("fixture")).unwrap(),
            vec![None; WANTED.len()]
        );
        // A separate debug file (what `--only-keep-debug` makes and distributions ship) is
        // read like any other.
        let split = dir.path().join("libsplit.so");
        let status = Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(library(dir.path(), "gcc", "-g"))
            .arg(&split)
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(member_offsets(&split, WANTED, None).unwrap(), EXPECTED);
    }

    #[test]
    fn dwarf_refuses_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let object = compile(
            dir.path(),
            "gcc",
            &[("fixture.c", FIXTURE)],
            &["-c", "-g"],
            "fixture.o",
        );
        let err = member_offsets(&object, WANTED, None).unwrap_err();
        assert!(matches!(err, DwarfError::Relocatable { .. }), "{err}");
        let plain = compile(
            dir.path(),
            "gcc",
            &[("fixture.c", FIXTURE)],
            &["-c", "-g0"],
            "plain.o",
        );
        assert_eq!(
            member_offsets(&plain, WANTED, None).unwrap(),
            vec![None; WANTED.len()]
        );

        // Compressed the ELF way (SHF_COMPRESSED) and the GNU way (.zdebug_*).
        let compressed = compile(
            dir.path(),
            "gcc",
            &[("fixture.c", FIXTURE)],
            &["-shared", "-fPIC", "-g", "-gz=zlib"],
            "libcompressed.so",
        );
        let gnu = dir.path().join("libzdebug.so");
        let status = Command::new("objcopy")
            .arg("--compress-debug-sections=zlib-gnu")
            .arg(library(dir.path(), "gcc", "-g"))
            .arg(&gnu)
            .status()
            .unwrap();
        assert!(status.success());
        for lib in [compressed, gnu] {
            let err = member_offsets(&lib, WANTED, None).unwrap_err();
            assert!(
                matches!(
                    err,
                    DwarfError::Compressed {
                        section: ".debug_info",
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("not supported"), "{err}");
        }

        let text = dir.path().join("fixture.c");
        let err = member_offsets(&text, WANTED, None).unwrap_err();
        assert!(matches!(err, DwarfError::Parse { .. }), "{err}");
        let err = member_offsets(&dir.path().join("missing.so"), WANTED, None).unwrap_err();
        assert!(matches!(err, DwarfError::Open { .. }), "{err}");
        assert!(member_offsets(&text, &[], None).unwrap().is_empty());
    }

    #[test]
    fn dwarf_corrupt_files_give_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let lib = library(dir.path(), "gcc", "-gdwarf-5");
        let bytes = std::fs::read(&lib).unwrap();
        let cache = ReadCache::new(File::open(&lib).unwrap());
        let obj = object::File::parse(&cache).unwrap();
        let range = |name: &str| {
            let (offset, size) = obj.section_by_name(name).unwrap().file_range().unwrap();
            offset as usize..(offset + size) as usize
        };
        let targets = [
            range(".debug_info"),
            range(".debug_abbrev"),
            range(".debug_str"),
        ];
        let copy = dir.path().join("corrupt.so");
        let mut outcomes = (0, 0);
        let mut check = |data: &[u8]| {
            std::fs::write(&copy, data).unwrap();
            match member_offsets(&copy, WANTED, None) {
                Ok(found) => {
                    assert_eq!(found.len(), WANTED.len());
                    outcomes.0 += 1;
                }
                Err(_) => outcomes.1 += 1,
            }
        };
        // Cut anywhere inside or before the debug sections.
        for cut in (0..bytes.len())
            .step_by(97)
            .chain(targets[0].clone().step_by(7))
        {
            check(&bytes[..cut]);
        }
        // Every byte of the unit, abbreviation and string data set to values that break
        // lengths, LEB128 numbers, forms, codes, offsets and terminators.
        for target in &targets {
            for at in target.clone() {
                for value in [0x00, 0x80, 0xff] {
                    let mut data = bytes.clone();
                    data[at] = value;
                    check(&data);
                }
            }
        }
        // Both outcomes happen: corruption is detected, and harmless changes still answer.
        assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
    }
}
