//! Function symbols of an ELF executable or shared library, found by their demangled C++ names
//! ("server_queue::post", or a full signature to pick one overload), with the file offsets that
//! uprobes attach to. Reads `.symtab` when present and `.dynsym` always, so a stripped build
//! still resolves its exported C API. The file is read through a cache, not loaded whole: engine
//! libraries are 100+ MB.
use std::{fs::File, path::Path};

use object::{
    Object, ObjectSegment, ObjectSymbol, SymbolKind,
    read::{ReadCache, elf::ElfFile64},
};

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a 64-bit ELF file this agent can read: {source}")]
    Parse {
        path: String,
        #[source]
        source: object::Error,
    },
}

#[derive(Debug, Clone)]
struct RawSymbol {
    mangled: String,
    address: u64,
}

/// A function found by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSymbol {
    /// Demangled name with its parameter list (C names are their own demangling).
    pub name: String,
    pub mangled: String,
    pub address: u64,
    /// Where the function's first instruction sits in the file (what a uprobe attaches to).
    pub file_offset: u64,
}

pub struct ElfSymbols {
    functions: Vec<RawSymbol>,
    /// PT_LOAD segments: (virtual address, size in memory, file offset).
    segments: Vec<(u64, u64, u64)>,
    has_symtab: bool,
}

impl ElfSymbols {
    pub fn load(path: &Path) -> Result<Self, SymbolError> {
        let file = File::open(path).map_err(|source| SymbolError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let cache = ReadCache::new(file);
        let elf = ElfFile64::<object::Endianness, _>::parse(&cache).map_err(|source| {
            SymbolError::Parse {
                path: path.display().to_string(),
                source,
            }
        })?;
        let has_symtab = elf.symbol_table().is_some();
        let mut functions: Vec<RawSymbol> = elf
            .symbols()
            .chain(elf.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
            .filter_map(|s| {
                Some(RawSymbol {
                    mangled: s.name().ok()?.to_owned(),
                    address: s.address(),
                })
            })
            .collect();
        functions.sort_unstable_by(|a, b| (a.address, &a.mangled).cmp(&(b.address, &b.mangled)));
        functions.dedup_by(|a, b| a.address == b.address && a.mangled == b.mangled);
        let segments = elf
            .segments()
            .map(|seg| (seg.address(), seg.size(), seg.file_range().0))
            .collect();
        Ok(Self {
            functions,
            segments,
            has_symtab,
        })
    }

    /// Whether the full symbol table is there; without it only exported functions resolve.
    pub fn has_symtab(&self) -> bool {
        self.has_symtab
    }

    /// Functions whose demangled name is `pattern`: either the qualified name alone
    /// ("server_queue::post": every overload) or the full signature ("server_queue::post(
    /// server_task&&, bool)"). Compiler-split parts ("[clone .cold]") are not entry points and
    /// never match.
    pub fn resolve(&self, pattern: &str) -> Vec<ResolvedSymbol> {
        let pattern = normalize(pattern);
        let with_params = pattern.contains('(');
        // Only demangle names that can match: every identifier of the pattern occurs in the
        // mangled form (C++ mangling keeps identifiers verbatim).
        let identifiers: Vec<&str> = qualified_name(&pattern)
            .split("::")
            .filter(|part| !part.is_empty())
            .collect();
        let mut found = Vec::new();
        for raw in &self.functions {
            if !identifiers.iter().all(|id| raw.mangled.contains(id)) {
                continue;
            }
            let name = demangle(&raw.mangled);
            if name.contains("[clone") {
                continue;
            }
            let normalized = normalize(&name);
            let matches = if with_params {
                normalized == pattern
            } else {
                qualified_name(&normalized) == pattern
            };
            if matches && let Some(file_offset) = self.file_offset(raw.address) {
                found.push(ResolvedSymbol {
                    name,
                    mangled: raw.mangled.clone(),
                    address: raw.address,
                    file_offset,
                });
            }
        }
        found.dedup_by(|a, b| a.address == b.address);
        found
    }

    /// The demangled name of the function that starts at `file_offset` (a runtime launch's host
    /// stub, found from its address in the process), if the file names one there.
    pub fn function_at_file_offset(&self, file_offset: u64) -> Option<String> {
        let address = self
            .segments
            .iter()
            .find(|(_, size, offset)| file_offset >= *offset && file_offset < offset + size)
            .map(|(vaddr, _, offset)| file_offset - offset + vaddr)?;
        let at = self.functions.partition_point(|f| f.address < address);
        let raw = self.functions.get(at).filter(|f| f.address == address)?;
        Some(demangle(&raw.mangled))
    }

    fn file_offset(&self, address: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(vaddr, size, _)| address >= *vaddr && address < vaddr + size)
            .map(|(vaddr, _, offset)| address - vaddr + offset)
    }
}

fn demangle(mangled: &str) -> String {
    cpp_demangle::Symbol::new(mangled.as_bytes())
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| mangled.to_owned())
}

/// The name before its parameter list.
fn qualified_name(name: &str) -> &str {
    name.split_once('(').map_or(name, |(head, _)| head).trim()
}

/// Whitespace differences ("const&" vs "const &") must not decide a match.
fn normalize(name: &str) -> String {
    name.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" &", "&")
        .replace(" *", "*")
        .replace("( ", "(")
        .replace(" )", ")")
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    const SOURCE: &str = r#"
        struct server_task { int id; };
        struct server_queue {
            int post(server_task&& task, bool front);
            int post(int n);
            void defer(server_task&& task);
        };
        int server_queue::post(server_task&& task, bool front) { return task.id + front; }
        int server_queue::post(int n) { return n; }
        void server_queue::defer(server_task&& task) { task.id = 0; }
        extern "C" int llama_decode(void* ctx, int batch) { return batch; }
        static int helper(int x) { return x * 3; }
        extern "C" int uses_helper(int x) { return helper(x); }
    "#;

    fn build(dir: &Path, strip: bool) -> std::path::PathBuf {
        let src = dir.join("engine.cpp");
        std::fs::write(&src, SOURCE).unwrap();
        let lib = dir.join(if strip {
            "libstripped.so"
        } else {
            "libengine.so"
        });
        let status = Command::new("c++")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .expect("a C++ compiler (scripts/setup.sh installs build-essential)");
        assert!(status.success());
        if strip {
            assert!(Command::new("strip").arg(&lib).status().unwrap().success());
        }
        lib
    }

    fn tempdir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "inferscope-symbols-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn resolves_methods_by_demangled_name_and_signature() {
        let dir = tempdir();
        let table = ElfSymbols::load(&build(&dir, false)).unwrap();
        assert!(table.has_symtab());
        let overloads = table.resolve("server_queue::post");
        assert_eq!(overloads.len(), 2, "{overloads:#?}");
        let one = table.resolve("server_queue::post(server_task &&, bool)");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "server_queue::post(server_task&&, bool)");
        assert!(one[0].mangled.starts_with("_ZN12server_queue4post"));
        assert_eq!(table.resolve("llama_decode").len(), 1);
        assert!(table.resolve("server_queue::pos").is_empty());
        assert!(table.resolve("server_queue::post(int, int)").is_empty());
        // The file offset points at the function's bytes: for a shared library linked at 0 the
        // text segment's offset equals its address.
        assert!(one[0].file_offset > 0);
        // Back from a file offset (a runtime launch's host stub) to the demangled name.
        assert_eq!(
            table.function_at_file_offset(one[0].file_offset).as_deref(),
            Some("server_queue::post(server_task&&, bool)")
        );
        assert_eq!(table.function_at_file_offset(one[0].file_offset + 1), None);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_stripped_library_keeps_only_exported_functions() {
        let dir = tempdir();
        let table = ElfSymbols::load(&build(&dir, true)).unwrap();
        assert!(!table.has_symtab());
        assert_eq!(table.resolve("llama_decode").len(), 1);
        // Member functions are exported too (default visibility); the static helper is not.
        assert!(table.resolve("helper").is_empty());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn garbage_files_are_errors_not_panics() {
        let dir = tempdir();
        let path = dir.join("garbage.so");
        std::fs::write(&path, b"\x7fELF\x02\x01\x01garbage").unwrap();
        assert!(matches!(
            ElfSymbols::load(&path),
            Err(SymbolError::Parse { .. })
        ));
        assert!(matches!(
            ElfSymbols::load(&dir.join("missing.so")),
            Err(SymbolError::Open { .. })
        ));
        std::fs::remove_dir_all(dir).ok();
    }
}
