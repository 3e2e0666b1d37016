//! Engine binaries and libraries read as ELF files, and the uprobes placed with what they say:
//! function symbols by demangled name ([`symbols`]), struct member offsets from DWARF
//! ([`dwarf`]), the engines' scheduler hooks ([`sched_hooks`]), user-defined probes from a spec
//! file ([`user_probes`]), and OpenSSL's read and write functions for HTTPS ([`tls`]).
pub(crate) mod dwarf;
pub(crate) mod sched_hooks;
pub(crate) mod symbols;
pub(crate) mod tls;
pub(crate) mod user_probes;
